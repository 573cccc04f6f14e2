"""Warm entries (minicompile/runtime/entries.py): a compiled frame on disk, loaded by a new
process without capture, and never a stale hit.

A *new process* is simulated in-process by a fresh wrapper after ``minicompile.reset()``
(which also forgets the loaded modules); two tests run real processes, to see what a
warm process imports and does not.  Every compiled call is compared with eager.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.runtime import cache, fingerprints, guard_paths
from minicompile.runtime.entries import size_symbols

from devices import CUDA

ROOT = Path(__file__).resolve().parents[2]

SOURCE = """
import torch
K = 2

def helper(x):
    return torch.cos(x) * K

def f(x, y):
    return torch.sin(x) * 2 + helper(y)
"""


def load_source(text: str, name: str = "warm_module") -> types.ModuleType:
    """Run ``text`` as a module registered under ``name`` (recipes find objects through
    sys.modules), as a new process importing it would."""
    module = types.ModuleType(name)
    module.__file__ = f"/virtual/{name}.py"
    sys.modules[name] = module
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


@pytest.fixture
def warm(tmp_path: Path):
    """Warm entries on, in a cache of the test's own."""
    with config.patch(warm_entries=True, cache_dir=tmp_path / "cache"):
        yield tmp_path / "cache"
    sys.modules.pop("warm_module", None)


def call_twice(fn, module: types.ModuleType, backend: str, device: torch.device) -> dict:
    """A fresh process's view: compile ``fn`` anew, call it with two sets of values, compare
    with eager; return the stats."""
    minicompile.reset()
    compiled = minicompile.compile(fn, backend=backend)
    for seed in (0, 1):
        torch.manual_seed(seed)
        x, y = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    return minicompile.stats()


def entry_files(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("entries/*/*.json"))


def test_second_process_loads_the_entry(warm: Path, backend: str, device: torch.device) -> None:
    m = load_source(SOURCE)
    cold = call_twice(m.f, m, backend, device)
    assert cold["frames"] == 1 and cold["instructions"] > 0, cold
    assert len(entry_files(warm)) == 1
    hit = call_twice(m.f, m, backend, device)
    assert hit["frames"] == hit["instructions"] == hit["graphs"] == 0, hit
    assert hit["warm_entries"] == 1, hit
    assert hit["kernels"] == cold["kernels"]


def test_changed_source_line_misses(warm: Path, backend: str, device: torch.device) -> None:
    m = load_source(SOURCE)
    call_twice(m.f, m, backend, device)
    for changed in (SOURCE.replace("* 2 +", "* 3 +"),  # the function's own line
                    SOURCE.replace("* K", "* K + 1"),  # a line of the function it inlined
                    "\n" + SOURCE):  # only the line numbers
        m = load_source(changed)
        stats = call_twice(m.f, m, backend, device)
        assert stats["frames"] == 1, (changed, stats)


def test_changed_guarded_value_misses(warm: Path, backend: str, device: torch.device) -> None:
    m = load_source(SOURCE)
    call_twice(m.f, m, backend, device)
    m.K = 5  # the global helper() reads: the entry on disk is not loaded, nor counted
    stats = call_twice(m.f, m, backend, device)
    assert stats["frames"] == 1 and stats["recompiles"] == stats["warm_entries"] == 0, stats
    m.K = 2  # back to the first entry's value: that entry is a hit again
    stats = call_twice(m.f, m, backend, device)
    assert stats["frames"] == 0, stats


def test_union_type_read_by_the_trace_is_stored(warm: Path, backend: str,
                                                 device: torch.device) -> None:
    """``int | None`` is made anew where it is written: equal, never the same object."""
    text = SOURCE + "OPTIONAL = int | None\n\ndef g(x, y):\n    return f(x, y) if " \
        "isinstance(K, OPTIONAL) else x\n"
    m = load_source(text)
    assert call_twice(m.g, m, backend, device)["frames"] == 1
    assert call_twice(m.g, m, backend, device)["warm_entries"] == 1
    m = load_source(text.replace("int | None", "float | None"))  # another union: a miss
    assert call_twice(m.g, m, backend, device)["frames"] == 1


@pytest.mark.parametrize("what", ["torch", "minicompile"])
def test_changed_version_misses(warm: Path, backend: str, device: torch.device,
                                monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    m = load_source(SOURCE)
    call_twice(m.f, m, backend, device)
    if what == "torch":
        versions = cache.tool_versions
        monkeypatch.setattr(cache, "tool_versions", lambda cxx: versions(cxx) + "\ntorch=next")
    else:
        monkeypatch.setattr(fingerprints, "source_version", lambda: "another minicompile")
    stats = call_twice(m.f, m, backend, device)
    assert stats["frames"] == 1, stats


def test_changed_inlined_function_misses(warm: Path, backend: str, device: torch.device) -> None:
    m = load_source(SOURCE)
    call_twice(m.f, m, backend, device)
    m.helper = load_source(SOURCE.replace("torch.cos(x)", "torch.tanh(x)"), "other").helper
    sys.modules["warm_module"] = m
    stats = call_twice(m.f, m, backend, device)
    assert stats["frames"] == 1, stats


@pytest.mark.parametrize("damage", ["truncated", "edited", "empty"])
def test_corrupted_entry_is_rebuilt_with_a_warning(warm: Path, damage: str) -> None:
    m = load_source(SOURCE)
    call_twice(m.f, m, "cpp", torch.device("cpu"))
    (path,) = entry_files(warm)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2],
                      "edited": data.replace(b"(4, 8)", b"(4, 9)"),
                      "empty": b""}[damage])
    cache._warned.clear()
    with pytest.warns(RuntimeWarning, match="corrupted"):
        stats = call_twice(m.f, m, "cpp", torch.device("cpu"))
    assert stats["frames"] == 1, stats
    stats = call_twice(m.f, m, "cpp", torch.device("cpu"))  # rewritten: warm again
    assert stats["frames"] == 0, stats


# -- lazy, newest first: only the entry a call needs ----------------------------------------


def call_sizes(fn, sizes, backend: str = "cpp", **options) -> tuple[dict, object]:
    """A fresh process's view: compile ``fn`` anew, call it with inputs of each row count in
    ``sizes`` (compared with eager); the stats and the compiled function."""
    minicompile.reset()
    compiled = minicompile.compile(fn, backend=backend, **options)
    for n in sizes:
        x, y = torch.randn(n, 8), torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    return minicompile.stats(), compiled


def test_only_the_entry_a_call_needs_is_loaded(warm: Path, capsys: pytest.CaptureFixture
                                               ) -> None:
    m = load_source(SOURCE)
    call_sizes(m.f, (4, 6), dynamic=False)
    assert len(entry_files(warm)) == 2
    with config.patch(logs=frozenset({"cache"})):
        stats, compiled = call_sizes(m.f, (4,), dynamic=False)
    # The newest entry (6 rows) is looked at first and says why it is not used.
    err = capsys.readouterr().err
    assert "not used: guard failed: L['x'] size mismatch at index 0: expected 6, got 4" in err
    assert "loaded (sizes symbolic: none)" in err
    assert len(compiled.entries) == stats["warm_entries"] == 1, stats
    assert stats["graphs"] == stats["frames"] == stats["recompiles"] == 0, stats


def test_reset_means_the_same_with_a_full_cache(warm: Path) -> None:
    m = load_source(SOURCE)
    _, compiled = call_sizes(m.f, (4, 6), dynamic=False)
    minicompile.reset()  # nothing in memory, every counter zero: as with no cache at all
    assert compiled.entries == [] and set(minicompile.stats().values()) == {0}
    for n in (6, 4):
        x, y = torch.randn(n, 8), torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, y), m.f(x, y))
        assert minicompile.stats()["warm_entries"] == len(compiled.entries)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["warm_entries"], stats["recompiles"]) == (0, 2, 1), stats


def test_loaded_entries_do_not_use_up_the_recompile_limit(warm: Path) -> None:
    m = load_source(SOURCE)
    with config.patch(recompile_limit=2):
        call_sizes(m.f, (4, 6), dynamic=False)
        stats, compiled = call_sizes(m.f, (4, 6, 5), dynamic=False)
    assert (stats["warm_entries"], stats["graphs"], stats["eager_fallbacks"]) == (2, 1, 0), stats
    assert len(compiled.entries) == 3


def test_an_entry_is_loaded_only_where_automatic_dynamic_decides_the_same(
    warm: Path, capsys: pytest.CaptureFixture
) -> None:
    """On disk: static for 4 rows, then symbolic (rows seen to change).  A new process
    called with 6 rows first compiles static for 6, as it would with no cache; then 4 rows
    is a change, and the symbolic entry made for one is loaded."""
    m = load_source(SOURCE)
    cold, _ = call_sizes(m.f, (4, 6))
    with config.patch(logs=frozenset({"cache"})):
        stats, compiled = call_sizes(m.f, (6, 4, 9))
    assert ("compiled when L['x'] dim(s) [0] had changed, L['y'] dim(s) [0] had changed; for "
            "this call no size had changed") in capsys.readouterr().err
    assert (stats["graphs"], stats["warm_entries"], stats["recompiles"]) == (1, 1, 1), stats
    assert stats["recompiles"] == cold["recompiles"] and len(compiled.entries) == 2
    assert size_symbols(compiled.entries[0].capture) == ["L['x'].shape[0]", "L['y'].shape[0]"]


@pytest.mark.parametrize("other", ["options", "version"])
def test_entries_of_other_options_and_versions_say_why(warm: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       other: str) -> None:
    m = load_source(SOURCE)
    call_sizes(m.f, (4,), dynamic=False)
    if other == "version":
        monkeypatch.setattr(fingerprints, "source_version", lambda: "another minicompile")
    with config.patch(logs=frozenset({"cache"})):
        stats, _ = call_sizes(m.f, (4,), dynamic=other == "options")
    assert stats["frames"] == 1 and stats["warm_entries"] == 0, stats
    assert {"options": "compiled with other options: dynamic=False (this call: True)",
            "version": "written by another version of minicompile"}[other] in (
        capsys.readouterr().err)


# -- real processes ----------------------------------------------------------------------------

SCRIPT = """
import json, sys, time
import torch
start = time.perf_counter()
import minicompile
import_s = time.perf_counter() - start

def f(x, y):
    return torch.sin(x) * 2 + torch.cos(y)

g = minicompile.compile(f, backend={backend!r})
imported = None
for seed in (0, 1):
    torch.manual_seed(seed)
    x, y = torch.randn(4, 8, device={device!r}), torch.randn(4, 8, device={device!r})
    out = g(x, y)
    if imported is None:  # before assert_close, which imports sympy itself
        imported = [m for m in ("sympy", "torch._dynamo", "networkx", "minicompile.capture",
                                "triton") if m in sys.modules]
    torch.testing.assert_close(out, f(x, y))
stats = minicompile.stats()
stats["imported"] = imported
print(json.dumps(stats))
"""


def run_script(script: str, env_extra: dict[str, str], cwd: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMPILE_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout, not whichever is installed
    if not CUDA:
        env.setdefault("TRITON_INTERPRET", "1")
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_warm_process_imports_no_compiler(backend: str, device: torch.device,
                                          tmp_path: Path) -> None:
    script = SCRIPT.format(backend=backend, device=str(device))
    env = {"MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    cold, _ = run_script(script, env, tmp_path)
    assert cold["frames"] == 1 and "sympy" in cold["imported"], cold
    # Float pointwise metadata without PyTorch's meta functions, which import Dynamo; the
    # scheduling passes keep their own DAG (passes/dag.py), not networkx.
    assert "torch._dynamo" not in cold["imported"] and "networkx" not in cold["imported"], cold
    hot, _ = run_script(script, env, tmp_path)
    assert hot["frames"] == hot["instructions"] == hot["graphs"] == 0, hot
    assert hot["warm_entries"] == 1, hot
    # No capture, sympy, networkx or Dynamo.  Triton only under its interpreter: on a GPU
    # the kernels' cubins are in the cache and launch without it (runtime/triton_build.py).
    from minicompile.runtime import triton_build

    gpu_static = device.type == "cuda" and triton_build.available()
    assert hot["imported"] == ([] if backend == "cpp" or gpu_static else ["triton"]), hot


def test_perf_log_prints_phases_and_a_summary(tmp_path: Path) -> None:
    script = SCRIPT.format(backend="cpp", device="cpu")
    env = {"MINICOMPILE_CACHE_DIR": str(tmp_path / "cache"), "MINICOMPILE_LOGS": "perf"}
    _, err = run_script(script, env, tmp_path)
    line = next(x for x in err.splitlines() if x.startswith("minicompile perf: graph f:"))
    for phase in ("capture", "passes", "lowering", "fusion", "codegen", "build", "load"):
        assert f"{phase} " in line, line
    assert "minicompile perf: summary: 1 graph(s) compiled" in err
    _, err = run_script(script, env, tmp_path)
    assert "1 warm entry(ies) of f loaded" in err and "0 graph(s) compiled" in err, err


@pytest.mark.parametrize("artefact", ["cpp/*/*.so", "py/*/mc_*.py"],
                         ids=["library", "wrapper_module"])
def test_corrupted_library_is_rebuilt_with_a_warning(tmp_path: Path, artefact: str) -> None:
    # In processes of their own: this one may not overwrite a library it has loaded.
    script = SCRIPT.format(backend="cpp", device="cpu")
    env = {"MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    run_script(script, env, tmp_path)
    (lib,) = (tmp_path / "cache").glob(artefact)
    lib.write_bytes(lib.read_bytes()[:100])  # a half-written library or module
    stats, err = run_script(script, env, tmp_path)
    assert err.count("is corrupted") == 1, err
    assert stats["frames"] == 1, stats
    stats, err = run_script(script, env, tmp_path)  # rebuilt, and warm again
    assert stats["frames"] == 0 and "corrupted" not in err, (stats, err)


MODULE_SOURCE = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, width, scale):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.scale = scale

    def forward(self, x):
        return x + F.gelu(self.fc(self.norm(x))) * self.scale
"""


def call_module_twice(module: torch.nn.Module) -> dict:
    """A fresh process's view of a compiled module: two calls with different values."""
    minicompile.reset()
    compiled = minicompile.compile(module)
    with torch.no_grad():
        for seed in (0, 1):
            torch.manual_seed(seed)
            x = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
    return minicompile.stats()


def test_module_entry_needs_the_same_module(warm: Path) -> None:
    m = load_source(MODULE_SOURCE)
    torch.manual_seed(0)
    call_module_twice(m.Block(8, 2.0).eval())
    assert len(entry_files(warm)) == 1
    torch.manual_seed(1)  # other weights: values are inputs, the entry holds
    stats = call_module_twice(m.Block(8, 2.0).eval())
    assert stats["frames"] == 0, stats
    stats = call_module_twice(m.Block(8, 3.0).eval())  # another attribute read by forward
    assert stats["frames"] == 1, stats
    block = m.Block(8, 2.0).eval()
    block.norm.eps = 1e-3  # a submodule's hyperparameter
    stats = call_module_twice(block)
    assert stats["frames"] == 1, stats
    stats = call_module_twice(m.Block(8, 2.0).train())  # the training flag
    assert stats["frames"] == 1, stats
    changed = load_source(MODULE_SOURCE.replace("* self.scale", "* self.scale + 1"))
    stats = call_module_twice(changed.Block(8, 2.0).eval())  # the class's code
    assert stats["frames"] == 1, stats


def test_warm_guards_read_what_their_checks_read_from_the_entry(
    warm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded entry's dict-version gate records from the paths its entry stored (no
    check parsed again), skips what they cover on the next call, and still sees a module
    changed afterwards."""
    m = load_source(MODULE_SOURCE)
    call_module_twice(m.Block(8, 2.0).eval())
    (entry,) = entry_files(warm)
    stored = json.loads(entry.read_bytes().split(b"\n", 1)[1])["guard_paths"]
    assert stored is not None and any(stored["reads"]), stored
    parsed = []
    monkeypatch.setattr(guard_paths.Analysis, "of", lambda *a: parsed.append(a))
    block = m.Block(8, 2.0).eval()
    minicompile.reset()
    compiled = minicompile.compile(block)
    with torch.no_grad():
        for seed in (0, 1):
            x = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x), block(x), rtol=1e-5, atol=1e-5)
        assert minicompile.stats()["frames"] == 0 and not parsed
        (entry,) = compiled.__dict__["_compiled"].entries
        gate = entry.capture.guards.check.__self__
        assert gate.skipped > 0 and gate.versions is not None
        block.scale = 3.0  # an attribute a covered check reads
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), block(x), rtol=1e-5, atol=1e-5)


def test_module_with_an_unkeyable_attribute_is_not_stored(
    warm: Path, capsys: pytest.CaptureFixture
) -> None:
    m = load_source(MODULE_SOURCE)
    block = m.Block(8, 2.0).eval()
    block.handle = open(os.devnull)  # an object a fingerprint cannot describe
    try:
        with config.patch(logs=frozenset({"cache"})):
            call_module_twice(block)
    finally:
        block.handle.close()
    assert "cannot be fingerprinted" in capsys.readouterr().err
    assert not entry_files(warm)


def test_reset_looks_on_disk_again(warm: Path) -> None:
    m = load_source(SOURCE)
    compiled = minicompile.compile(m.f, backend="cpp")
    for expect_frames in (1, 0):  # traced, then (after reset) read back from disk
        minicompile.reset()
        for seed in (0, 1):
            torch.manual_seed(seed)
            x, y = torch.randn(4, 8), torch.randn(4, 8)
            torch.testing.assert_close(compiled(x, y), m.f(x, y))
        assert minicompile.stats()["frames"] == expect_frames


@pytest.mark.parametrize("collector", ["on", "off"])
def test_no_collection_while_an_entry_loads(warm: Path, monkeypatch: pytest.MonkeyPatch,
                                            collector: str) -> None:
    """The collector is off while an entry loads (it makes tens of thousands of objects that
    live on) and as it was after it; a load that misses leaves it as it was too."""
    from minicompile.runtime import entries

    seen = []
    load = entries._load

    def watched(*args: object) -> object:
        seen.append(gc.isenabled())
        return load(*args)

    monkeypatch.setattr(entries, "_load", watched)
    m = load_source(SOURCE)
    call_twice(m.f, m, "cpp", torch.device("cpu"))  # stored
    (gc.enable if collector == "on" else gc.disable)()
    try:
        assert call_twice(m.f, m, "cpp", torch.device("cpu"))["warm_entries"] == 1
        assert gc.isenabled() is (collector == "on")
        m.K = 3  # (a guarded global: the entry's guard fails, and f compiles again)
        stats = call_twice(m.f, m, "cpp", torch.device("cpu"))
        assert stats["frames"] == 1 and stats["warm_entries"] == 0, stats
        assert gc.isenabled() is (collector == "on")
    finally:
        gc.enable()
    assert seen == [False, False], seen


MUTATING_SOURCE = """
import torch

def f(x, y):
    x.mul_(2)
    return x + y
"""


def test_entry_that_mutates_an_input_loads(warm: Path, backend: str,
                                           device: torch.device) -> None:
    """Its rebuild calls write_back, which a warm process finds (minicompile/runtime/
    values.py: capture's modules are not imported there), and the caller's tensor gets its
    new contents."""
    m = load_source(MUTATING_SOURCE)
    for process in ("cold", "warm"):
        minicompile.reset()
        compiled = minicompile.compile(m.f, backend=backend)
        for seed in (0, 1):
            torch.manual_seed(seed)
            x, y = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
            x_eager = x.clone()
            torch.testing.assert_close(compiled(x, y), m.f(x_eager, y))
            torch.testing.assert_close(x, x_eager)
        stats = minicompile.stats()
        assert stats["frames"] == (1 if process == "cold" else 0), (process, stats)
    # A process that never captured has not imported capture's modules: the entry's
    # recipes must not name them (they did: write_back lived in capture/side_effects.py).
    (entry,) = entry_files(warm)
    text = entry.read_text()
    assert "minicompile.runtime.values" in text and "minicompile.capture" not in text


INDEXING = """
import torch
import torch.nn.functional as F

def f(idx, w):
    try:
        return F.embedding(idx, w * 2) + 1
    except IndexError:
        return w[:1] - 1

def g(idx, w):
    return F.embedding(idx, w * 2) + 1
"""


@pytest.mark.parametrize("name", ["f", "g"])
def test_user_error_in_a_loaded_entry_is_eagers(warm: Path, backend: str,
                                               device: torch.device, name: str) -> None:
    # An entry read from disk has no graph to run eagerly and tell whose error it is: the
    # call runs eagerly, raising (g) or catching (f) the user's IndexError as eager does.
    if device.type == "cuda":
        pytest.skip("an index out of range is a device-side assert on CUDA, in eager too: "
                    "no IndexError to catch, and the process's CUDA context is lost")
    m = load_source(INDEXING)
    fn = getattr(m, name)
    w = torch.randn(4, 3, device=device)
    for expect_frames in (1, 0):  # traced, then read back from disk
        minicompile.reset()
        compiled = minicompile.compile(fn, backend=backend)
        for idx in ([0, 3], [1, 9], [2, 2]):
            idx = torch.tensor(idx, device=device)
            try:
                expected = fn(idx, w)
            except IndexError as e:
                with pytest.raises(IndexError, match=str(e)):
                    compiled(idx, w)
                continue
            torch.testing.assert_close(compiled(idx, w), expected)
        stats = minicompile.stats()
        assert stats["frames"] == expect_frames and stats["eager_fallbacks"] == 0, stats


def test_an_entrys_modules_are_found_together_and_a_missing_one_is_named() -> None:
    """An entry's frame modules are read by one expression; when one is not there, the
    miss names that one (another structure of arguments)."""
    from minicompile.runtime import entries

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    wheres = ["self", "self[0]", "self[1]"]
    found = entries._frame_values(["self"], wheres, {}, (model,))
    assert found == [model, model[0], model[1]] and found[1] is model[0]
    with pytest.raises(entries.Miss, match=r"^self\[2\]: IndexError$"):
        entries._frame_values(["self"], [*wheres, "self[2]"], {}, (model,))
    assert entries._frame_values(["self"], [], {}, (model,)) == []


HOISTING_MODELS = """
import torch
import torch.nn as nn

class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))

class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(32, 16), nn.Embedding(8, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        return self.head(torch.tanh(self.wte(idx) + self.wpe(pos)))
"""

HOISTING_SCRIPT = """
import json, torch, minicompile
from hoisting_models import ConvBN, TinyGPT

device, frames = torch.device({device!r}), {{}}
cases = {{"conv_bn": (ConvBN, lambda: torch.randn(2, 3, 8, 8, device=device),
                     lambda m: m.bn.running_var.mul_(2)),
         "gpt": (TinyGPT, lambda: torch.randint(0, 32, (2, 8), device=device),
                 lambda m: m.wpe.weight.mul_(2))}}
for name, (cls, make_input, mutate) in cases.items():
    minicompile.reset()
    model = cls().to(device).eval()
    compiled = minicompile.compile(model, backend={backend!r})
    with torch.no_grad():
        for step in range(3):
            if step == 2:  # a parameter changed between calls: its values computed anew
                mutate(model)
            x = make_input()
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    frames[name] = minicompile.stats()["frames"]
print(json.dumps(frames))
"""


def test_entry_with_values_computed_from_parameters_loads(backend: str, device: torch.device,
                                                          tmp_path: Path) -> None:
    """A batch norm folded into its convolution and GPT's position embeddings are computed
    from parameters once (runtime/derived.py); the entry stores that graph as JSON, and a
    second process loads it, computing anew when a parameter changes."""
    (tmp_path / "hoisting_models.py").write_text(HOISTING_MODELS)
    script = HOISTING_SCRIPT.format(backend=backend, device=str(device))
    env = {"MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    cold, _ = run_script(script, env, tmp_path)
    assert cold == {"conv_bn": 1, "gpt": 1}, cold
    stored = [p.read_text() for p in entry_files(tmp_path / "cache")]
    assert len(stored) == 2 and all('"positions": [' in text for text in stored), stored
    warm, _ = run_script(script, env, tmp_path)
    assert warm == {"conv_bn": 0, "gpt": 0}, warm


TABLE_SOURCE = """
import torch

class Factor:
    def __init__(self, value):
        self.value = value

def scaled(factor):
    def scale(x):
        return x * factor.value
    return scale

class Config:  # (huggingface_hub's strict dataclasses keep their validators so)
    __validators__ = {"scale": [scaled(Factor(2.0))]}

def f(x, y):
    return torch.sin(x) + Config.__validators__["scale"][0](y)
"""


def test_closure_kept_in_a_class_table_is_stored(warm: Path, backend: str,
                                                 device: torch.device) -> None:
    """A closure over an object of no name, found again through the class's table and
    keyed by its code: loaded where both are the same, never where either changed."""
    m = load_source(TABLE_SOURCE)
    assert call_twice(m.f, m, backend, device)["frames"] == 1
    assert len(entry_files(warm)) == 1
    m = load_source(TABLE_SOURCE)  # a new process: the same source
    assert call_twice(m.f, m, backend, device)["frames"] == 0
    m.Config.__validators__["scale"][0] = m.scaled(m.Factor(3.0))  # another value
    assert call_twice(m.f, m, backend, device)["frames"] == 1
    m = load_source(TABLE_SOURCE.replace("x * factor.value", "x * factor.value + 1"))
    assert call_twice(m.f, m, backend, device)["frames"] == 1  # the closure's code
