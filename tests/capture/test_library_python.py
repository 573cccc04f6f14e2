"""The Python that library model code runs around its tensors, compiled without a graph break.

Each program is written the way transformers, timm and torchvision write theirs
(decorators that read ``func.__code__``, ``torch._assert``, ``ModelOutput`` results, caches
made inside ``forward``, configs copied and edited, ``os.environ`` switches).  Every one is
compiled with ``fullgraph=True`` (a break raises), called three times with fresh values and
compared with eager; where the trace read a Python value, a test changes it and checks that
the compiled function follows (a guard, never a value baked in).
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import logging
import os
import warnings
from typing import Any

import pytest
import torch
from transformers.utils import ModelOutput

import minicompile

from model_zoo import tensors_of


def compiled_matches_eager(fn: Any, *shapes: tuple[int, ...], calls: int = 3) -> Any:
    """Compile ``fn`` whole, call it ``calls`` times on fresh random tensors of ``shapes``
    and compare every returned leaf with eager; the compiled function."""
    compiled = minicompile.compile(fn, backend="cpp", fullgraph=True)
    for _ in range(calls):
        args = [torch.randn(s) for s in shapes]
        got, want = tensors_of(compiled(*args)), tensors_of(fn(*args))
        assert len(got) == len(want)
        for a, e in zip(got, want):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e)
            else:
                assert a == e
    assert minicompile.stats()["graph_breaks"] == 0
    return compiled


# -- functions, decorators, signatures ------------------------------------------------------


def defaults_from(config: dict):
    """transformers' merge_with_config_defaults: reads ``func.__code__.co_varnames``."""

    def deco(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for name in ("scale", "shift"):
                index = func.__code__.co_varnames.index(name) if (
                    name in func.__code__.co_varnames) else None
                if kwargs.get(name) is None and (index is None or len(args) <= index):
                    kwargs[name] = config[name]
            return func(*args, **kwargs)

        return wrapper

    return deco


@defaults_from({"scale": 2.0, "shift": 0.5})
def scaled(x, scale=None, shift=None):
    return x * scale + shift


def test_decorator_reading_code_and_keywords() -> None:
    compiled_matches_eager(lambda x: scaled(x) + scaled(x, shift=1.0), (4, 8))


def test_function_attributes_and_signature() -> None:
    def count_args(fn):
        @functools.wraps(fn)
        def wrapper(x):
            n = len(inspect.signature(fn).parameters)
            return fn(x) * n + len(wrapper.__wrapped__.__defaults__ or ())

        return wrapper

    @count_args
    def inner(x, a=1, b=2):
        return x + a + b

    def f(x):
        assert inner.__name__ == "inner" and inner.__wrapped__.__qualname__.endswith("inner")
        return inner(x)

    compiled_matches_eager(f, (3,))


def test_callable_on_functions_made_in_the_trace() -> None:
    def f(x):
        fns = [lambda t: t + 1, torch.sin]
        assert all(callable(g) for g in fns)
        return fns[0](x) * fns[1](x)

    compiled_matches_eager(f, (5,))


# -- checks, queries, warnings and logs -----------------------------------------------------


def test_asserts_and_checks_on_python_values() -> None:
    def f(x):
        torch._assert(x.ndim == 2, "expected 2-D input")
        torch._check(x.shape[1] == 8, lambda: "8 columns")
        torch._check_is_size(x.shape[0])
        return x.relu()

    compiled_matches_eager(f, (4, 8))
    lenient = minicompile.compile(f, backend="cpp")
    with pytest.raises(AssertionError, match="expected 2-D input"):
        lenient(torch.randn(8))  # the frame runs eagerly, and raises eager's error
    on_data = minicompile.compile(lambda x: torch._check(x.sum() > -1e9) or x, fullgraph=True)
    with pytest.raises(minicompile.Unsupported, match="a check on a tensor's value"):
        on_data(torch.randn(4))


def test_compile_state_queries() -> None:
    def f(x):
        if torch.jit.is_scripting() or torch.jit.is_tracing():
            return x
        return x + 1 if torch.compiler.is_compiling() else x - 1

    compiled = minicompile.compile(f, backend="cpp", fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x + 1)  # as torch.compile: compiling is True
    torch.testing.assert_close(f(x), x - 1)


def test_autocast_query_and_python_context_managers() -> None:
    def maybe_autocast(device_type, enabled=True):  # transformers' maybe_autocast
        if torch.is_autocast_enabled(device_type) or enabled:
            return torch.autocast(device_type, enabled=enabled)
        return contextlib.nullcontext()

    def f(x):
        with maybe_autocast(x.device.type, enabled=False):
            y = x.float().sin()
        with torch.autocast(x.device.type, enabled=False):  # older transformers' rotary
            y = y.cos()
        with contextlib.nullcontext(y) as z:
            return z * 2

    compiled_matches_eager(f, (2, 5))


def test_warnings_and_logging_do_not_break() -> None:
    logger = logging.getLogger("minicompile.test")

    def f(x):
        warnings.warn("deprecated path", FutureWarning)
        logger.info("running f on %d rows", x.shape[0])
        return x * 2

    with pytest.warns(FutureWarning, match="deprecated path"):
        compiled_matches_eager(f, (3, 2))


def test_finfo_iinfo_and_enum_values() -> None:
    class Mode(enum.Enum):
        MASK = "mask"
        KEEP = "keep"

    mode = Mode.MASK

    def f(x):
        low = torch.finfo(x.dtype).min
        top = torch.iinfo(torch.int32).max
        if mode is Mode.MASK:
            return torch.where(x > 0, x, low), x.clamp(max=top)
        return x, x

    compiled_matches_eager(f, (6,))


def test_device_objects_made_from_constants() -> None:
    # FX's generated code (a Dynamo graph under backend="minicompile") spells devices so
    def f(x):
        cpu = torch.device(type="cpu")
        return torch.arange(x.shape[0], device=cpu) * x, torch.device("cpu", 0).index

    compiled_matches_eager(f, (5,))


# -- configs: attributes, dict methods, copies, the environment -----------------------------


class Config:
    attribute_map = {"layers": "num_layers"}

    def __init__(self) -> None:
        self.num_layers = 2
        self.scale = 0.5
        self.extra = {"bias": 1.0}
        self.names = ["a", "b"]

    def __getattribute__(self, key):  # transformers' PreTrainedConfig renames attributes
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


def test_config_reads_follow_the_config() -> None:
    config = Config()

    def f(x):
        out = x * config.scale + config.extra.get("bias", 0.0)
        for _ in range(config.layers):
            out = out + config.extra.setdefault("step", 1.0)
        return out, len(config.names)

    compiled = compiled_matches_eager(f, (4,))
    config.num_layers = 3  # read through __getattribute__'s renaming: guarded
    config.scale = 2.0
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))


def test_deepcopy_of_a_config_edited_in_the_trace() -> None:
    config = Config()

    def f(x):
        local = copy.deepcopy(config)
        local.layers = local.layers + 1  # renamed by the copy's __setattr__
        local.names.append("c")  # the copy's own list
        del local.extra
        return x * local.num_layers * len(local.names), hasattr(local, "extra")

    compiled = compiled_matches_eager(f, (4,))
    assert config.names == ["a", "b"] and config.num_layers == 2 and config.extra
    config.num_layers = 5
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x)[0], f(x)[0])


def test_environment_switch() -> None:
    def f(x):
        if os.environ.get("MINICOMPILE_TEST_SWITCH", "0") == "1":
            return x + 1
        return x - 1

    compiled = compiled_matches_eager(f, (3,))
    x = torch.randn(3)
    os.environ["MINICOMPILE_TEST_SWITCH"] = "1"
    try:
        torch.testing.assert_close(compiled(x), x + 1)  # the guard reads it again
    finally:
        del os.environ["MINICOMPILE_TEST_SWITCH"]
    torch.testing.assert_close(compiled(x), x - 1)


def test_import_of_a_loaded_module() -> None:
    def f(x):
        import math

        from torch.nn import functional as F

        return F.relu(x) * math.pi

    compiled_matches_eager(f, (5,))


# -- objects made inside the trace ----------------------------------------------------------


@dataclasses.dataclass
class Output(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    pooled: torch.Tensor | None = None
    hidden_states: tuple | None = None


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor
    tag: str = "pair"

    def total(self):
        return self.first + self.second


def test_model_output_built_indexed_and_returned() -> None:
    def f(x):
        out = Output(last_hidden_state=x.sin())
        out["hidden_states"] = (x, x.cos())  # a new key, at the end of the mapping
        out.pooled = out[0].mean(0)
        assert list(out.keys()) == ["last_hidden_state", "hidden_states", "pooled"]
        first, *rest = out.to_tuple()
        return out, first + out["pooled"], len(rest), isinstance(out, ModelOutput)

    compiled = compiled_matches_eager(f, (3, 4))
    got = compiled(torch.randn(3, 4))[0]
    assert type(got) is Output and list(got.keys()) == ["last_hidden_state", "hidden_states",
                                                        "pooled"]


def test_model_output_built_plainly_as_eager_builds_it() -> None:
    """A ModelOutput returned as built (runtime/values.py: model_output): after the first
    call, made without its constructor; its items, attributes, pytree leaves and a write
    after the call are eager's."""

    def f(x, extra):
        return Output(last_hidden_state=x.sin(), hidden_states=extra)

    compiled = minicompile.compile(f, backend="cpp", fullgraph=True)
    for _ in range(3):
        x, extra = torch.randn(3, 4), torch.randn(2)
        got, want = compiled(x, extra), f(x, extra)
        assert type(got) is Output and list(got.keys()) == list(want.keys())
        assert list(vars(got)) == list(vars(want)) and got.pooled is None
        torch.testing.assert_close(got.to_tuple(), want.to_tuple())
        assert got["hidden_states"] is extra and got.hidden_states is extra
        leaves = torch.utils._pytree.tree_leaves(got)
        assert len(leaves) == 2 and leaves[1] is extra
        got.pooled = x  # ModelOutput.__setattr__: a new item
        assert list(got.keys()) == ["last_hidden_state", "hidden_states", "pooled"]
    assert minicompile.stats()["graphs"] == 1


def test_model_output_read_from_the_frame() -> None:
    """A ModelOutput the frame is given (an encoder's result handed over at a graph break,
    as in BART's forward): read through its own ``__getitem__`` (``to_tuple()``,
    ``dict(self.items())``); its keys are guarded."""

    def f(out):
        return out[0] * 2 + out["pooled"], len(out.to_tuple())

    compiled = minicompile.compile(f, backend="cpp", fullgraph=True)
    for extra in ({}, {}, {"hidden_states": (torch.randn(3),)}):
        out = Output(last_hidden_state=torch.randn(3), pooled=torch.randn(3), **extra)
        got, want = compiled(out), f(out)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    assert minicompile.stats()["graphs"] == 2  # the new key: traced again


def test_plain_dataclass_record() -> None:
    def f(x):
        p = Pair(x, x * 2)
        p.second = p.second + 1
        return p, p.total(), p.tag

    compiled_matches_eager(f, (4,))


class Layer:
    def __init__(self) -> None:
        self.keys = None

    def update(self, k):
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-1)
        return self.keys


class Cache:
    """transformers' DynamicCache: made in forward, filled by each layer, returned."""

    def __init__(self, layers: int) -> None:
        self.layers = [Layer() for _ in range(layers)]

    def __len__(self):
        return len(self.layers)

    def update(self, k, i):
        return self.layers[i].update(k)


def test_object_made_filled_and_returned() -> None:
    def f(x):
        cache = Cache(2)
        for i in range(len(cache)):
            cache.update(x * i, i)
            cache.update(x + i, i)
        return cache, cache.layers[1].keys.sum()

    compiled = compiled_matches_eager(f, (2, 3))
    cache = compiled(torch.randn(2, 3))[0]
    assert type(cache) is Cache and len(cache.layers) == 2 and cache.layers[0].keys.shape == (2, 6)


class Registry(collections.abc.MutableMapping):
    """transformers' AttentionInterface: a mapping with a class-wide table."""

    _global = {"sin": torch.sin}

    def __init__(self) -> None:
        self._local = {}

    def __getitem__(self, key):
        return self._local[key] if key in self._local else self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


class Layers(collections.abc.Sequence):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)  # how Sequence's own __iter__ stops
        return i * 10


def test_user_mapping_and_sequence_protocols() -> None:
    registry = Registry()
    registry["cos"] = torch.cos

    def f(x):
        total = sum(Layers(3))
        if "cos" in registry and "tan" not in registry:
            return registry["cos"](x) + registry["sin"](x) + total + len(registry)
        return x

    compiled = compiled_matches_eager(f, (4,))
    registry["cos"] = torch.tanh  # the table changed: a guard sees it
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))


def test_list_concatenation_and_no_grad_decorated_helpers() -> None:
    @torch.no_grad()
    def helper(t):
        return t * 3

    def f(x):
        parts = [x[:1]] + [helper(x)]
        return torch.cat(parts + [x.cos()], dim=0)

    compiled_matches_eager(f, (2, 3))


def test_transformer_encoder_with_a_padding_mask_matches_eager_in_every_mode() -> None:
    """nn.TransformerEncoder given a padding mask: in eval under no_grad eager takes its
    nested-tensor path (padded positions of the result are zero), which the encoder then
    runs eagerly (a graph break naming it), so the result is eager's to the bit; in
    training it compiles whole, loss and gradients as eager's."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    pad = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    compiled = minicompile.compile(model, backend="cpp")
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 6, 16)
            got, want = compiled(x, src_key_padding_mask=pad), model(x, src_key_padding_mask=pad)
            assert bool((want[0, 4:] == 0).all())  # (eager's nested path)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    minicompile.reset()
    twin = copy.deepcopy(model).train()
    model.train()
    compiled = minicompile.compile(twin, backend="cpp", fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 6, 16)
        got = compiled(x, src_key_padding_mask=pad).square().mean()
        want = model(x, src_key_padding_mask=pad).square().mean()
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    assert minicompile.stats()["graph_breaks"] == 0


_PROBE_ANSWER = {"value": True}


@functools.lru_cache
def _cached_probe(version: str, accept_dev: bool = False) -> bool:
    return version.startswith("2")


def _probe() -> bool:
    return _PROBE_ANSWER["value"]


# transformers' install and version probes: torch._dynamo.assume_constant_result's marker
# on the function, under lru_cache or not.
_cached_probe.__wrapped__._dynamo_marked_constant = True
_probe._dynamo_marked_constant = True


def test_questions_fixed_for_the_process_are_answered_while_tracing() -> None:
    def f(x):
        y = x * 2 if _cached_probe("2.10.0", accept_dev=True) else x * 3
        if torch.cuda.is_available() and torch.cuda.get_device_capability() < (7, 0):
            y = y + 100
        return y - 1 if _probe() else y + 1

    compiled = compiled_matches_eager(f, (4, 5))
    _PROBE_ANSWER["value"] = False  # (asked again by a guard: a changed answer recompiles)
    try:
        x = torch.randn(4, 5)
        torch.testing.assert_close(compiled(x), f(x))
        assert minicompile.stats()["recompiles"] == 1
    finally:
        _PROBE_ANSWER["value"] = True


def _raising_probe(version: str) -> bool:
    raise ValueError(f"not a version: {version!r}")


_raising_probe._dynamo_marked_constant = True


def test_a_process_question_that_raises_raises_as_in_eager() -> None:
    def f(x):
        return x + 1 if _raising_probe("2.x") else x

    with pytest.raises(minicompile.Unsupported, match=r"_raising_probe\(\) raises ValueError"):
        minicompile.compile(f, backend="cpp", fullgraph=True)(torch.randn(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the user's error: no warning of an internal one)
        with pytest.raises(ValueError, match="not a version"):
            minicompile.compile(f, backend="cpp")(torch.randn(3))


def test_a_process_question_about_a_tensor_breaks() -> None:
    def f(x):
        return x + 1 if _cached_probe(x) else x

    with pytest.raises(minicompile.Unsupported, match="values not known while tracing"):
        minicompile.compile(f, backend="cpp", fullgraph=True)(torch.randn(3))
