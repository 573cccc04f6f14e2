"""The cyclic collector skips the pre-existing heap during a compile (minicompile/heap.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

import minicompile
from minicompile import heap


@pytest.fixture(autouse=True)
def _nothing_frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with nothing of anyone's frozen beyond what the interpreter keeps
    frozen, which is then heap.BASELINE.  (Python 3.12 keeps a few hundred objects in the
    permanent generation after each full collection; gc.unfreeze() releases them until
    the next one.  So "left as found" is: no more frozen than that.)"""
    gc.unfreeze()
    gc.collect()
    monkeypatch.setattr(heap, "BASELINE", gc.get_freeze_count())
    yield


class _Cycle:
    def __init__(self) -> None:
        self.me = self


_MOVES_OUT_AND_BACK = """
import gc
from minicompile import heap

class Cycle:
    def __init__(self):
        self.me = self

gc.unfreeze()  # (some Pythons keep a few objects frozen anyway: heap.BASELINE)
gc.collect()
heap.BASELINE = gc.get_freeze_count()
with heap.frozen():
    assert gc.get_freeze_count() > 0  # what lived at entry is frozen
    before = gc.get_freeze_count()
    with heap.frozen():  # nested: the outer one owns the freeze
        assert gc.get_freeze_count() == before
    assert gc.get_freeze_count() == before
    young = Cycle()
    heap.refreeze()
    assert gc.get_freeze_count() > before and gc.is_tracked(young)
    del young
gc.collect()  # (after which Python 3.12 keeps its few objects frozen again)
assert gc.get_freeze_count() == heap.BASELINE
print("ok")
"""


def test_frozen_moves_old_objects_out_and_back() -> None:
    # In a fresh interpreter, with nothing of anyone's frozen at the start.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _MOVES_OUT_AND_BACK], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_cycles_made_inside_are_still_collected() -> None:
    with heap.frozen():
        dead = _Cycle()
        del dead
        assert gc.collect() > 0  # garbage made during the compile is freed there


def test_someone_elses_freeze_and_a_disabled_collector_are_left_alone() -> None:
    gc.freeze()
    try:
        frozen_by_user = gc.get_freeze_count()
        with heap.frozen():
            heap.refreeze()  # not ours: nothing more is frozen
            assert gc.get_freeze_count() == frozen_by_user
        assert gc.get_freeze_count() == frozen_by_user  # their freeze stays
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with heap.frozen():
            assert gc.get_freeze_count() <= heap.BASELINE
    finally:
        gc.enable()


def test_a_compile_leaves_the_heap_as_it_found_it(backend: str, device: torch.device) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    compiled = minicompile.compile(f, backend=backend)
    for x in (torch.randn(4, 5, device=device), torch.randn(4, 5, device=device).t()):
        torch.testing.assert_close(compiled(x), f(x))
    assert gc.get_freeze_count() <= heap.BASELINE  # nothing left frozen
    assert gc.isenabled()


def test_a_compile_that_raises_unfreezes(backend: str, device: torch.device) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("from the user's code")

    compiled = minicompile.compile(f, backend=backend)
    try:
        compiled(torch.randn(3, device=device))
    except ValueError:
        pass
    else:
        raise AssertionError("the user's error was swallowed")
    assert gc.get_freeze_count() <= heap.BASELINE
