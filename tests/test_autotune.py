"""mode="max-autotune": Triton launch configurations timed at the first run of each size
class (codegen/triton_tuning.py, minicompile/runtime/autotune.py).

Every compiled function is compared with eager, called at least twice with different
values.  The Triton backend runs on the GPU when there is one, else under Triton's
interpreter on CPU tensors; sizes stay small (the interpreter runs every candidate).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.codegen import triton_tuning, wrapper
from minicompile.runtime import autotune

from devices import CUDA, device_for
from graph_builder import GraphBuilder, compile_graph_text

DEVICE = device_for("triton")


@pytest.fixture
def tuning_cache(tmp_path: Path) -> Iterator[Path]:
    """A cache directory of the test's own, so that every size class is tuned afresh."""
    with config.patch(cache_dir=tmp_path):
        yield tmp_path


def tuned() -> int:
    return autotune.counters["tuned"]


def records(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "autotune").rglob("*.json"))


def check_twice(fn: Callable, make_args: Callable[[int], tuple], **options: object) -> None:
    """``fn`` compiled under max-autotune matches eager on two calls with different values."""
    compiled = minicompile.compile(fn, backend="triton", mode="max-autotune", **options)
    for seed in (0, 1):
        args = make_args(seed)
        torch.testing.assert_close(compiled(*args), fn(*args))


def randn(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(DEVICE)


# -- values --------------------------------------------------------------------------------


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x.sin() * 2 + 1) - x.cos()


def layer_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1) * 3


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(0)


def transposed(x: torch.Tensor) -> torch.Tensor:
    return x.t().exp() + x.t().sum(1, keepdim=True)


CASES = {
    "pointwise_chain": (pointwise_chain, lambda s: (randn(1000, seed=s),)),
    "layer_norm": (layer_norm, lambda s: (randn(6, 300, seed=s), randn(300, seed=s + 7))),
    "softmax": (softmax, lambda s: (randn(5, 200, seed=s),)),
    "column_sum": (column_sum, lambda s: (randn(200, 12, seed=s),)),
    "non_contiguous": (transposed, lambda s: (randn(40, 24, seed=s),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_and_tunes(name: str, tuning_cache: Path) -> None:
    fn, make_args = CASES[name]
    before = tuned()
    check_twice(fn, make_args)
    assert tuned() > before  # tuned at the first call...
    assert records(tuning_cache)  # ...and the choice is on disk
    after = tuned()
    check_twice(fn, make_args)  # the same sizes: chosen already
    assert tuned() == after


def broadcast_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).tanh()


def scaled_sum(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x.sum(-1) * s


MORE = {
    "broadcast": (broadcast_mul, lambda s: (randn(40, 1, seed=s), randn(1, 30, seed=s + 3))),
    "empty": (scaled_sum, lambda s: (randn(0, 10, seed=s), randn(seed=s))),
    "zero_dim": (broadcast_mul, lambda s: (randn(seed=s), randn(seed=s + 1))),
    "bfloat16": (layer_norm, lambda s: (randn(6, 300, seed=s).bfloat16(),
                                        randn(300, seed=s + 7).bfloat16())),
    "float16_row_sum": (scaled_sum, lambda s: (randn(12, 700, seed=s).half(),
                                               randn(seed=s).half())),
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_other_inputs_match_eager(name: str, tuning_cache: Path) -> None:
    fn, make_args = MORE[name]
    check_twice(fn, make_args)


def test_cpp_backend_under_max_autotune_matches_eager(tuning_cache: Path) -> None:
    # The C++ backend has no launch configuration to tune: it compiles as by default.
    compiled = minicompile.compile(layer_norm, backend="cpp", mode="max-autotune")
    before = tuned()
    for seed in (0, 1):
        x, w = torch.randn(6, 300), torch.randn(300)
        torch.testing.assert_close(compiled(x, w), layer_norm(x, w))
    assert tuned() == before and not records(tuning_cache)


def add_in_place(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * y


@pytest.mark.parametrize("store_in_place", [False, True], ids=["written_back", "in_place"])
def test_mutated_input_is_never_changed_by_tuning(store_in_place: bool, tuning_cache: Path,
                                                   ) -> None:
    """The kernel that computes x + 1 is tuned on copies of what it stores: x is
    incremented once a call, however many candidates ran (with store_in_place the kernel
    stores into x itself)."""
    with config.patch(store_in_place=store_in_place):
        compiled = minicompile.compile(add_in_place, backend="triton", mode="max-autotune")
        before = tuned()
        for seed in (0, 1):
            x, y = randn(300, seed=seed), randn(300, seed=seed + 5)
            x_eager = x.clone()
            expected = add_in_place(x_eager, y)
            torch.testing.assert_close(compiled(x, y), expected)
            torch.testing.assert_close(x, x_eager)
        assert tuned() > before


def test_dynamic_sizes_tune_once_per_size_class(tuning_cache: Path) -> None:
    compiled = minicompile.compile(softmax, backend="triton", mode="max-autotune", dynamic=True)
    counts = []
    for rows, seed in ((100, 0), (300, 1), (260, 2), (300, 3)):
        x = randn(rows, 24, seed=seed)
        torch.testing.assert_close(compiled(x), softmax(x))
        counts.append(tuned())
    # 100 rows: class 2^7; 300 rows: 2^9, tuned; 260 rows: 2^9 again, not tuned.
    assert counts[1] > counts[0] and counts[3] == counts[2] == counts[1]


def test_the_forced_winner_is_the_one_launched(tuning_cache: Path) -> None:
    """A timer that makes the last candidate fastest: it, not the heuristic's, runs every
    later call of the size class, and the values are still right."""
    seen: list[autotune.Choice] = []
    clock = itertools.count()

    def timer(choice: autotune.Choice, run: Callable[[], None], reset: Callable[[], None],
              ) -> float:
        reset()
        run()
        seen.append(choice)
        return 100.0 - next(clock)  # each candidate faster than the one before

    with autotune.use_timer(timer):
        check_twice(softmax, lambda s: (randn(5, 200, seed=s),))
    assert len(seen) >= 3  # the heuristic and at least two alternatives
    winner, heuristic = seen[-1], seen[0]
    assert winner.launches == 2 and heuristic.launches == 0
    assert all(c.launches == 0 for c in seen[:-1])
    record = json.loads(records(tuning_cache)[0].read_text())
    assert record["config"] == winner.describe(record["kernel"])
    assert record["choice"] == len(seen) - 1


@torch.no_grad()
def test_a_library_model_under_max_autotune_matches_eager(tuning_cache: Path) -> None:
    """transformers' GPT-2 (tiny, random init) compiled whole under max-autotune: its
    kernels are tuned at the first call, and both calls, with fresh tokens, match eager."""
    from model_zoo import MODELS, tensors_of

    case = next(c for c in MODELS if str(c) == "hf_gpt2")
    torch.manual_seed(0)
    model = case.build().eval().to(DEVICE)
    compiled = minicompile.compile(model, backend="triton", mode="max-autotune",
                                   fullgraph=True)
    before = tuned()
    for seed in (1, 2):
        torch.manual_seed(seed)
        args, kwargs = case.inputs(DEVICE)
        got, want = tensors_of(compiled(*args, **kwargs)), tensors_of(model(*args, **kwargs))
        assert len(got) == len(want)
        for a, e in zip(got, want):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4)
            else:
                assert a == e
    assert tuned() > before


@pytest.mark.parametrize("gain, heuristic_kept", [(0.01, True), (0.05, False)])
def test_a_candidate_replaces_the_heuristic_only_when_clearly_faster(
        tuning_cache: Path, gain: float, heuristic_kept: bool) -> None:
    """Within the timings' noise (autotune.MARGIN) the heuristic's configuration stays."""
    seen: list[autotune.Choice] = []

    def timer(choice: autotune.Choice, run: Callable[[], None],
              reset: Callable[[], None]) -> float:
        seen.append(choice)
        return 1.0 if len(seen) == 1 else 1.0 - gain  # every alternative that much faster

    with autotune.use_timer(timer):
        check_twice(softmax, lambda s: (randn(5, 200, seed=s),))
    assert len(seen) >= 2
    assert (seen[0].launches == 2) is heuristic_kept
    assert (seen[1].launches == 2) is not heuristic_kept  # (the first of the fastest)


@pytest.mark.parametrize("name", ["softmax", "column_sum", "pointwise_chain"])
def test_every_candidate_matches_eager(name: str, tmp_path: Path) -> None:
    """Each candidate in turn made the winner (its own cache directory, this process's
    choices forgotten) computes what eager does."""
    fn, make_args = CASES[name]
    count, k = None, 0
    while count is None or k < count:
        seen: list[autotune.Choice] = []

        def timer(choice: autotune.Choice, run: Callable[[], None],
                  reset: Callable[[], None]) -> float:
            seen.append(choice)
            return 0.0 if len(seen) - 1 == k else 1.0

        minicompile.reset()
        with config.patch(cache_dir=tmp_path / str(k)), autotune.use_timer(timer):
            check_twice(fn, make_args)
        count = count or len(seen)
        assert seen[k].launches == 2 and len(seen) == count  # the forced one ran
        k += 1
    assert count >= 2


@pytest.mark.skipif(not CUDA, reason="CUDA graphs record on a GPU")
def test_no_tuning_while_a_cuda_graph_records(tuning_cache: Path) -> None:
    compiled = minicompile.compile(softmax, backend="triton", mode="max-autotune", dynamic=True)
    x = randn(100, 24, seed=0)
    torch.testing.assert_close(compiled(x), softmax(x))  # compiled; 2^7 rows tuned
    big = randn(300, 24, seed=1)  # 2^9 rows: a size class not tuned yet
    before = tuned()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        out = compiled(big)  # the heuristic's configuration, recorded
    assert tuned() == before
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, softmax(big))
    torch.testing.assert_close(compiled(big), softmax(big))  # outside a recording: tuned
    assert tuned() == before + 1


def test_tuning_is_logged_with_every_candidate(tuning_cache: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    with config.patch(logs=frozenset({"autotune"})):
        check_twice(pointwise_chain, lambda s: (randn(1000, seed=s),))
    err = capsys.readouterr().err
    assert "minicompile autotune: triton_poi_" in err and "numel 2^10" in err
    assert err.count("(chosen)") == 1 and "(the heuristic)" in err and " ms" in err


def test_corrupted_record_warns_and_tunes_again(tuning_cache: Path) -> None:
    check_twice(column_sum, lambda s: (randn(200, 12, seed=s),))
    (path,) = records(tuning_cache)
    path.write_text('{"format": "minicompile-autotune-1", "choice": 9')  # cut short
    minicompile.reset()  # this process forgets its choices: the next call reads the disk
    before = tuned()
    with pytest.warns(RuntimeWarning, match="autotuning record .* is corrupted"):
        check_twice(column_sum, lambda s: (randn(200, 12, seed=s + 2),))
    assert tuned() == before + 1
    assert json.loads(path.read_text())["format"] == "minicompile-autotune-1"  # rewritten


SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import minicompile
    from minicompile.runtime import autotune

    def f(x):
        return torch.softmax(x, -1) + x.cos()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    compiled = minicompile.compile(f, backend="triton", mode="max-autotune")
    for seed in (0, 1):
        x = torch.randn(5, 200, generator=torch.Generator().manual_seed(seed)).to(device)
        torch.testing.assert_close(compiled(x), f(x))
    print(json.dumps({"autotune": autotune.counters, "stats": minicompile.stats()}))
""")


def test_a_second_process_does_not_tune_again(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMPILE_")}
    env.update(MINICOMPILE_CACHE_DIR=str(tmp_path / "cache"), MINICOMPILE_WARM_ENTRIES="1",
               MINICOMPILE_LOGS="autotune",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), *sys.path]))
    if not CUDA:
        env["TRITON_INTERPRET"] = "1"
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr))
    (first, first_log), (second, second_log) = runs
    assert first["autotune"]["tuned"] >= 1 and first["autotune"]["from_disk"] == 0
    assert "(chosen)" in first_log
    # The second process loads the warm entry (no capture) and reads the choices from disk.
    assert second["stats"]["frames"] == 0
    assert second["autotune"]["tuned"] == 0
    assert second["autotune"]["from_disk"] == first["autotune"]["tuned"]
    assert "(chosen)" not in second_log and "chosen earlier, read from" in second_log


# -- generated code ------------------------------------------------------------------------


def graphs(device: str) -> list:
    """A pointwise kernel, a persistent and a looped reduction, one that checks indices."""
    made = []
    b = GraphBuilder(device)
    x = b.input("L_x", (10000,))
    b.output(b("sin", x))
    made.append(b.graph)
    b = GraphBuilder(device)
    x = b.input("L_x", (8, 300))
    b.output(b("exp", b("sub", x, b("amax", x, (1,), True))), b("sum", x, (0,), False))
    made.append(b.graph)
    b = GraphBuilder(device)
    x = b.input("L_x", (4, 10000))
    b.output(b("sum", b("cos", x), (1,), False))
    made.append(b.graph)
    b = GraphBuilder(device)
    w = b.input("L_w", (10, 8))
    i = b.input("L_i", (4,), torch.int64)
    b.output(b("sum", b("sin", b("embedding", w, i)), (1,), False), b("cos", w))
    made.append(b.graph)
    return made


def generated(graph: object, autotune_: bool) -> str:
    c = compile_graph_text(graph, "triton")
    return wrapper.generate(c.program, c.groups, "triton", autotune=autotune_).module


LAUNCH_LINES = ("Launcher", "_launch(", "[(")  # what max-autotune replaces


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_default_mode_code_has_no_tuning_and_max_autotune_differs_only_at_launches(
        device: str) -> None:
    for graph in graphs(device):
        default, tuned_code = generated(graph, False), generated(graph, True)
        assert default == compile_graph_text(graph, "triton").code.module
        assert "Autotuner" not in default and "_tuned" not in default
        assert "max-autotune" not in default
        tuned_lines = set(tuned_code.splitlines())
        for line in default.splitlines():
            if any(m in line for m in LAUNCH_LINES):
                continue
            if line.strip().startswith(("xmask", "# xnumel is a multiple", "tl.store",
                                        "tmp", "rmask")):
                continue  # a candidate's block may need masks the heuristic's did not
            assert line in tuned_lines, line
        assert "# max-autotune: the launch configuration is tuned at the first run" in tuned_code
        c = compile_graph_text(graph, "triton")
        plans, _ = wrapper.plan_kernels(c.program, c.groups, "triton", {})
        for plan in plans:  # the heuristic's options are the first candidate's
            _, _, options = wrapper.triton_launch(c.program, plan)
            assert f"    Choice({plan.name}, {options}),  # the heuristic default" in tuned_code


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_candidates_are_valid(device: str) -> None:
    interpret = device == "cpu"
    for graph in graphs(device):
        c = compile_graph_text(graph, "triton")
        plans, _ = wrapper.plan_kernels(c.program, c.groups, "triton", {})
        for plan in plans:
            kernel = triton_tuning.tune_plan(plan, interpret)
            found = kernel.candidates
            assert 2 <= len(found) <= 8 and len(set(found)) == len(found)
            _, _, heuristic = wrapper.triton_launch(c.program, plan)
            expected = ", ".join(f"{k}={v}" for k, v in found[0].options().items())
            assert heuristic.startswith(expected)  # the heuristic's, first
            for cand in found:
                blocks = [cand.xblock] + ([cand.rblock] if cand.rblock else [])
                assert all(b & (b - 1) == 0 for b in blocks)
                assert cand.xblock * (cand.rblock or 1) <= triton_tuning.TRITON_MAX_NUMEL
                assert cand.warps is None or 1 <= cand.warps <= 16
                assert cand.stages is None or cand.kind == "looped"
                if cand.kind == "persistent":
                    assert cand.rblock >= int(plan.rnumel)
                if interpret:  # the interpreter ignores warps and stages
                    assert cand.warps == found[0].warps and cand.stages is None
            assert set(kernel.texts) == {cand.kind for cand in found}


class FakeLauncher:
    """Stands for a GPU Launcher: records the launches it is asked for."""

    def __init__(self, log: list, index: int, real: object) -> None:
        self.log, self.index, self.example = log, index, real.example

    def __call__(self, grid: int, *args: object) -> None:
        self.log.append((self.index, grid))


def test_gpu_autotuner_launches_the_choice_through_its_launcher(
        tuning_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU wrapper's Autotuner (no GPU needed: the Launchers are stand-ins): each
    candidate launches with its own grid, the forced winner launches the program, and the
    kernels built ahead of a first call are every candidate, then only the stored choice."""
    graph = graphs("cuda")[0]  # sin over 10000 elements
    namespace: dict = {}
    exec(compile(generated(graph, True), "generated", "exec"), namespace)
    (tuner,) = [v for v in namespace.values() if isinstance(v, autotune.Autotuner)]
    assert all(c.launcher.options == c.options for c in tuner.choices)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")
    assert len(tuner.ahead()) == len(tuner.choices)  # nothing stored: all are timed
    log: list = []
    for k, c in enumerate(tuner.choices):
        c.launcher = FakeLauncher(log, k, c.launcher)
    last = len(tuner.choices) - 1
    x = torch.randn(10000)
    out = torch.empty(10000)
    with autotune.use_timer(lambda c, run, reset: (run(), 0.0 if c is tuner.choices[last]
                                                   else 1.0)[1]):
        tuner((10000,), x, out, 10000)
        tuner((10000,), x, out, 10000)
    grids = {k: -(-10000 // c.options["XBLOCK"]) for k, c in enumerate(tuner.choices)}
    assert log[:len(grids)] == list(grids.items())  # tuning: each candidate once
    assert log[len(grids):] == [(last, grids[last])] * 2  # then the winner, for the program
    # A process starting with the choice on disk (the same kernel, for a CUDA device)
    # builds only it.
    key = tuner.key(autotune.size_class((10000,)), torch.device("cuda", 0))
    (tuning_cache / "autotune" / key[:2]).mkdir(parents=True)
    (tuning_cache / "autotune" / key[:2] / f"{key}.json").write_text(json.dumps({
        "format": autotune.FORMAT, "choice": last,
        "config": tuner.choices[last].describe(tuner.name)}))
    assert tuner.ahead() == [tuner.choices[last].launcher]
