"""Entries on disk are a cache, not state (issue #31): the dynamic-shape tests run twice, in
processes of their own, against one cache directory with warm entries on.  Both runs pass,
and each test decides the same in both: the entries it made (``graphs + warm_entries``),
``recompiles``, ``graph_breaks``, ``kernels`` and ``eager_fallbacks``, while the second
run loads from disk what the first compiled.

The subset: the C++ backend's tests of test_dynamic_shapes.py and test_symbolic_views.py
that compile in this process (the two that start processes of their own, and the Triton
interpreter's copies of the same tests, would double the time and test nothing more of the
cache).  test_symbolic_op_cases.py's 857 C++ cases passed twice so by hand, deciding the
same (6.5 min, then 0.5 min warm: too long for every run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FILES = ("test_dynamic_shapes.py", "test_symbolic_views.py")
SUBSET = "cpp and not log_names and not trace_shows"
DECIDED = ("recompiles", "graph_breaks", "kernels", "eager_fallbacks")


def run_tests(cache: Path, record: Path) -> dict[str, dict]:
    """Run the subset against ``cache``; each test's stats, by test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMPILE_")}
    env.update(MINICOMPILE_TEST_SHARED_CACHE=str(cache), MINICOMPILE_TEST_STATS=str(record),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", *(str(HERE / f) for f in FILES), "-q", "-x",
           "-p", "no:cacheprovider", "-p", "record_stats", "-k", SUBSET]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = record.read_text().splitlines()
    record.unlink()
    return {r["test"]: r["stats"] for r in map(json.loads, lines)}


def decided(stats: dict) -> dict:
    return {"entries": stats["graphs"] + stats["warm_entries"],
            **{k: stats[k] for k in DECIDED}}


def test_dynamic_shape_tests_twice_against_one_cache(tmp_path: Path) -> None:
    cache, record = tmp_path / "cache", tmp_path / "stats.jsonl"
    first = run_tests(cache, record)
    second = run_tests(cache, record)
    assert len(first) >= 10 and list(first) == list(second), (list(first), list(second))
    for test in first:
        assert decided(first[test]) == decided(second[test]), (test, first[test],
                                                               second[test])
    # The second run compiled only what is never stored (frames with graph breaks).
    warm = sum(s["warm_entries"] for s in second.values())
    compiled = [sum(s["graphs"] for s in run.values()) for run in (first, second)]
    assert warm > 0 and compiled[1] < compiled[0] // 2, (warm, compiled)
