"""Dynamic shapes (issue #5): one compile serves every batch size and sequence length.

Every call is checked against eager on fresh inputs, on both backends.  The counts are
the compiled entries of the function (``len(fn.entries)``): automatic dynamic compiles a
varying dimension at most twice (static, then symbolic); ``dynamic=True`` once; sizes 0
and 1 get entries of their own.  The same counts hold where entries come from disk
(tests/dynamic/test_warm_runs.py runs these tests with a full cache directory).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.runtime.entries import size_symbols

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)

from gpt import CausalSelfAttention, GPTConfig  # noqa: E402

BATCHES = (8, 16, 3, 33, 64, 5, 12, 2)  # eight sizes of at least 2
TOL = dict(rtol=1e-4, atol=1e-4)


def pointwise(x, y):
    return torch.sin(x) * 2 + y.exp() - 1


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _inputs(name: str, n: int, device: torch.device) -> tuple:
    if name == "pointwise":
        return torch.randn(n, 40, device=device), torch.randn(40, device=device)
    if name == "softmax":
        return (torch.randn(n, 50, device=device),)
    return (torch.randn(n, 48, device=device), torch.randn(48, device=device),
            torch.randn(48, device=device))


FUNCTIONS = {"pointwise": pointwise, "softmax": softmax, "layer_norm": layer_norm}


def symbols(entry) -> list[str]:
    """Where an entry's size symbols are read, compiled or loaded from disk."""
    return size_symbols(entry.capture)


def _run(fn, name: str, sizes, device: torch.device) -> None:
    for n in sizes:
        args = _inputs(name, n, device)
        torch.testing.assert_close(fn(*args), FUNCTIONS[name](*args), **TOL)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_automatic_dynamic_compiles_twice(name: str, backend: str, device: torch.device) -> None:
    fn = minicompile.compile(FUNCTIONS[name], backend=backend)
    _run(fn, name, BATCHES, device)
    assert len(fn.entries) == 2  # static for the first size, then symbolic
    assert symbols(fn.entries[0])
    assert minicompile.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dynamic_true_compiles_once(name: str, backend: str, device: torch.device) -> None:
    fn = minicompile.compile(FUNCTIONS[name], backend=backend, dynamic=True)
    _run(fn, name, BATCHES, device)
    assert len(fn.entries) == 1


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dynamic_false_compiles_every_size(name: str, backend: str, device: torch.device) -> None:
    fn = minicompile.compile(FUNCTIONS[name], backend=backend, dynamic=False)
    _run(fn, name, BATCHES[:3], device)
    assert len(fn.entries) == 3
    assert not any(symbols(e) for e in fn.entries)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_sizes_zero_and_one_are_specialised(name: str, backend: str, device: torch.device) -> None:
    fn = minicompile.compile(FUNCTIONS[name], backend=backend, dynamic=True)
    _run(fn, name, (0, 1, 7, 1, 0, 9), device)
    assert len(fn.entries) == 3  # 0, 1 and the symbolic entry
    _run(fn, name, (4, 100), device)
    assert len(fn.entries) == 3


def test_mark_dynamic_compiles_symbolic_first(backend: str, device: torch.device) -> None:
    fn = minicompile.compile(softmax, backend=backend)
    for n in BATCHES:
        x = torch.randn(n, 50, device=device)
        minicompile.mark_dynamic(x, 0)
        torch.testing.assert_close(fn(x), softmax(x), **TOL)
    assert len(fn.entries) == 1


def test_relations_between_sizes_are_guarded(backend: str, device: torch.device) -> None:
    """x + y broadcasts two symbolic sizes: the trace relies on them being equal."""

    def add(x, y):
        return x * 2 + y

    fn = minicompile.compile(add, backend=backend, dynamic=True)
    x, y = torch.randn(6, 5, device=device), torch.randn(6, 5, device=device)
    torch.testing.assert_close(fn(x, y), add(x, y))
    x, y = torch.randn(9, 5, device=device), torch.randn(9, 5, device=device)
    torch.testing.assert_close(fn(x, y), add(x, y))
    assert len(fn.entries) == 1
    guards = str(fn.entries[0].capture.guards)
    assert "L['x'].shape[0] == L['y'].shape[0]" in guards or (
        "L['y'].shape[0] == L['x'].shape[0]" in guards)
    # Sizes that broadcast differently (9 against 1) are another entry, not a wrong result.
    x, y = torch.randn(9, 5, device=device), torch.randn(1, 5, device=device)
    torch.testing.assert_close(fn(x, y), add(x, y))
    assert len(fn.entries) == 2


def test_non_contiguous_inputs(backend: str, device: torch.device) -> None:
    fn = minicompile.compile(softmax, backend=backend, dynamic=True)
    for n in (6, 10, 3):
        x = torch.randn(50, n, device=device).t()  # strides (1, n)
        torch.testing.assert_close(fn(x), softmax(x), **TOL)
    for n in (6, 10):
        x = torch.randn(n, 100, device=device)[:, ::2]  # strides (100, 2)
        torch.testing.assert_close(fn(x), softmax(x), **TOL)
    assert len(fn.entries) <= 2


def test_reduction_over_a_dynamic_dim(backend: str, device: torch.device) -> None:
    """The reduced dim itself varies: a looped reduction over a symbolic row length."""

    def fn(x):
        return torch.softmax(x, -1) * x.amax(-1, keepdim=True)

    compiled = minicompile.compile(fn, backend=backend, dynamic=True)
    for n in (5, 17, 300, 2):
        x = torch.randn(4, n, device=device)
        torch.testing.assert_close(compiled(x), fn(x), **TOL)
    assert len(compiled.entries) == 1


def test_sizes_read_in_python(backend: str, device: torch.device) -> None:
    """Sizes read into Python (x.shape, arithmetic, view) stay symbolic."""

    def fn(x):
        b, t = x.shape
        y = x.view(b, t // 4, 4).sum(-1)
        return y * (t // 4)

    compiled = minicompile.compile(fn, backend=backend, dynamic=True)
    for b, t in ((3, 8), (5, 8), (2, 16), (7, 12)):
        x = torch.randn(b, t, device=device)
        torch.testing.assert_close(compiled(x), fn(x), **TOL)
    assert len(compiled.entries) <= 2


@torch.no_grad()
def test_attention_module_batch_and_sequence(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4)).to(device).eval()
    compiled = minicompile.compile(model, backend=backend)
    entries = compiled._compiled.entries  # noqa: SLF001
    for b in BATCHES:
        x = torch.randn(b, 16, 32, device=device)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert len(entries) == 2  # static, then the batch dimension symbolic
    for t in (24, 9):  # the sequence length varies too: it becomes a symbol once
        for b in BATCHES[:4]:
            x = torch.randn(b, t, 32, device=device)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert len(entries) == 3
    for b in (0, 1):  # specialised: entries of their own
        x = torch.randn(b, 12, 32, device=device)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert minicompile.stats()["eager_fallbacks"] == 0


@torch.no_grad()
def test_attention_module_dynamic_true(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4)).to(device).eval()
    compiled = minicompile.compile(model, backend=backend, dynamic=True)
    for b, t in zip(BATCHES, (16, 24, 9, 16, 5, 30, 12, 7)):
        x = torch.randn(b, t, 32, device=device)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert len(compiled._compiled.entries) == 1  # noqa: SLF001


def test_dynamic_log_names_the_dimension() -> None:
    code = (
        "import torch, minicompile\n"
        "f = minicompile.compile(lambda x: x.sin() + 1)\n"
        "for n in (4, 6, 8):\n"
        "    f(torch.randn(n, 3))\n"
    )
    env = {**os.environ, "MINICOMPILE_LOGS": "dynamic"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert "L['x'] dim 0 is dynamic: traced with size 4, called with 6" in out.stderr
    assert "s0 = L['x'].shape[0]" in out.stderr


def test_python_int_argument_becomes_a_symbol(backend: str, device: torch.device) -> None:
    def fn(x, n):
        return x.reshape(n, -1).sum(1) * n

    compiled = minicompile.compile(fn, backend=backend)
    for n, m in ((2, 6), (3, 6), (4, 6), (5, 10), (6, 12), (7, 3)):
        x = torch.randn(n * m, device=device)
        torch.testing.assert_close(compiled(x, n), fn(x, n), **TOL)
    assert len(compiled.entries) == 2
    assert symbols(compiled.entries[0]) == ["L['x'].shape[0]", "L['n']"]
    guards = str(compiled.entries[0].capture.guards)
    assert "type(L_n) is int" in guards and "L_n >= 2" in guards
    # A size the reshape cannot divide is eager's error, not a wrong answer.
    with pytest.raises(RuntimeError):
        compiled(torch.randn(10, device=device), 3)


def test_a_length_that_moves_into_a_new_input_is_a_symbol(backend: str,
                                                         device: torch.device) -> None:
    """A decode loop: the prompt (length 7) comes first with no cache; then one token with
    a cache of the prompt's length, one longer each step.  The cache is a new input whose
    dim has the size the prompt's dim changed from: a symbol from its first compile."""

    def step(ids, cache=None):
        h = ids.float().unsqueeze(-1) * 0.5
        if cache is None:
            return h, h
        cache = torch.cat([cache, h], 1)
        return torch.softmax(h * cache.sum(1, keepdim=True), -1), cache

    compiled = minicompile.compile(step, backend=backend)
    ids = torch.randint(0, 9, (2, 7), device=device)
    _, cache = compiled(ids)
    for _ in range(4):
        ids = torch.randint(0, 9, (2, 1), device=device)
        got, want = compiled(ids, cache), step(ids, cache)
        torch.testing.assert_close(got, want, **TOL)
        cache = want[1]
    assert len(compiled.entries) == 2
    assert symbols(compiled.entries[0]) == ["L['cache'].shape[1]"]


def test_in_place_op_on_a_size_equal_to_a_moved_length(backend: str,
                                                      device: torch.device) -> None:
    """transformers' static cache with a prompt as long as a head (16): the cache made in the
    prefill is a new input whose head dim has the size the prompt's length moved from, so
    that dim is a symbol; ``index_copy_`` of a static-size head into it compiles (the op
    proves the sizes equal; a guard keeps it), no graph break."""

    def step(ids, cache=None):
        h = ids.float().unsqueeze(-1).expand(*ids.shape, 16) * 0.5
        if cache is None:
            return h, torch.zeros(2, 24, 16, device=ids.device)
        at = torch.arange(ids.shape[1], device=ids.device) + 16
        cache.index_copy_(1, at, h)
        return torch.softmax(cache.sum(1), -1), cache

    compiled = minicompile.compile(step, backend=backend)
    ids = torch.randint(0, 9, (2, 16), device=device)
    _, cache = compiled(ids)
    for _ in range(2):
        ids = torch.randint(0, 9, (2, 1), device=device)
        mine = cache.clone()
        got, want = compiled(ids, mine), step(ids, cache)
        torch.testing.assert_close(got, want, **TOL)
        assert got[1] is mine
    assert minicompile.stats()["graph_breaks"] == 0
    assert len(compiled.entries) == 2


def test_sizes_returned_and_kept_across_a_graph_break(backend: str, device: torch.device) -> None:
    """Sizes leave the compiled code as Python ints computed from the call's tensors."""

    def fn(x):
        b, t = x.shape
        y = x.sum(1) * t
        print_nothing = str(t)  # a call capture does not trace: a graph break
        return y + b, (b, t + 1), print_nothing

    compiled = minicompile.compile(fn, backend=backend, dynamic=True)
    for b, t in ((3, 5), (4, 7), (6, 2)):
        x = torch.randn(b, t, device=device)
        got, want = compiled(x), fn(x)
        torch.testing.assert_close(got[0], want[0], **TOL)
        assert got[1:] == want[1:] and type(got[1][1]) is int


def test_trace_shows_the_symbols() -> None:
    code = (
        "import torch, minicompile\n"
        "f = minicompile.compile(lambda x: torch.softmax(x, -1), dynamic=True)\n"
        "f(torch.randn(6, 50))\n"
    )
    env = {**os.environ, "MINICOMPILE_LOGS": "graph,output_code"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stderr
    assert "# s0 = L['x'].shape[0]  (dynamic; traced with 6)" in out
    assert "f32[s0, s1]" in out  # dynamic=True: every dim a symbol
    assert "s0 = arg0.shape[0]  # a dynamic size" in out  # the wrapper reads the size
    assert "int64_t s0" in out  # and passes it to the kernel


def test_index_printers_parenthesise_symbolic_divisors() -> None:
    from minicompile.codegen.printers import cpp_index, triton_index
    from minicompile.shapes import python_expr
    from minicompile.sym import FloorDiv, ModularIndexing, index_symbol, size_symbol

    x, s1 = index_symbol("x"), size_symbol(1)
    assert triton_index(FloorDiv(x, 32 * s1)) == "(x // (32*s1))"
    assert cpp_index(ModularIndexing(x, 32, s1 + 1)) == "((x / 32) % (s1 + 1))"
    assert python_expr(128 * FloorDiv(s1 * x, 2)) == "128*((s1*x) // 2)"
    for n, size in ((100, 3), (7, 5)):  # the printed text computes what sympy means
        value = eval(python_expr(FloorDiv(x, 4 * s1)), {"x": n, "s1": size})
        assert value == n // (4 * size)


def test_what_fails_symbolically_is_traced_static(backend: str, device: torch.device) -> None:
    """An op PyTorch rejects for these sizes fails the symbolic trace too: the frame is
    traced again with static sizes, where the op is a graph break and eager raises its own
    error, as it would without the compiler."""

    def fn(x, y):
        return (x @ y).sin()

    compiled = minicompile.compile(fn, backend=backend, dynamic=True)
    x, y = torch.randn(3, 4, device=device), torch.randn(4, 5, device=device)
    torch.testing.assert_close(compiled(x, y), fn(x, y), **TOL)
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        compiled(x, torch.randn(6, 5, device=device))
    x, y = torch.randn(7, 9, device=device), torch.randn(9, 2, device=device)
    torch.testing.assert_close(compiled(x, y), fn(x, y), **TOL)
    assert symbols(compiled.entries[-1])  # the first entry: symbolic
