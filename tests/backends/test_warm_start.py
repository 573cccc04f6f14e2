"""Every stored entry that matches is used: the workloads of examples/bench_startup.py (its
own, the benchmark functions of issue 31, the examples' compiled functions and modules, and
the model zoo's models) compiled by one process and loaded by the next, which compiles
nothing.

Each phase is one process running every workload (``bench_startup.py --check``: compiled
anew after ``minicompile.reset()``, called twice with fresh inputs, compared with eager), on
one cache directory; the second process runs with ``MINICOMPILE_LOGS=cache``, whose lines
say why an entry was not stored or not used, and a failure shows them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bench_startup
import pytest

from devices import CUDA, device_for

# bench_startup's workloads and the examples' (not resnet50: the zoo has two ResNets).
FUNCTIONS = [*(w for w in bench_startup.WORKLOADS if w != "resnet"),
             *bench_startup.EXAMPLE_WORKLOADS]


def check(names: list[str], backend: str, cache: Path) -> tuple[dict, str]:
    """``bench_startup.py --check`` in a fresh process on ``cache``: per workload, its
    stats and whether it matched eager; and the process's log."""
    env = bench_startup.child_env(cache)
    env["MINICOMPILE_LOGS"] = "cache"
    if backend == "triton" and not CUDA:
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, bench_startup.__file__, "--check", ",".join(names),
           "--backend", backend, "--device", device_for(backend).type]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def assert_second_process_compiles_nothing(names: list[str], backend: str, cache: Path) -> None:
    first, log = check(names, backend, cache)
    for name, found in first.items():
        assert found["matches"] and found["frames"] >= 1, (name, found, log[-3000:])
    second, log = check(names, backend, cache)
    for name, found in second.items():
        assert found["matches"], (name, found)
        assert found["frames"] == 0 and found["eager_fallbacks"] == 0, (name, found, log[-3000:])
        # (a loaded entry counts as a warm entry, not as a compiled graph)
        assert found["warm_entries"] == first[name]["graphs"] and found["graphs"] == 0, (
            name, found, first[name])


def test_second_process_compiles_nothing(backend: str, tmp_path: Path) -> None:
    assert_second_process_compiles_nothing(FUNCTIONS, backend, tmp_path)


@pytest.mark.skipif(os.environ.get("MINICOMPILE_TEST_ZOO") != "1", reason=(
    "the zoo's two processes take 100-300 s on a 2-core CPU: MINICOMPILE_TEST_ZOO=1 runs "
    "them"))
def test_second_process_compiles_no_zoo_model(backend: str, tmp_path: Path) -> None:
    assert_second_process_compiles_nothing(bench_startup.expand("zoo"), backend, tmp_path)
