"""Keep Python's cyclic garbage collector off the heap that exists before a compile.

A cold compile allocates hundreds of thousands of objects, and each full collection walks
every object in the process (nanoGPT's cold call: three, 0.28 s).  :func:`frozen` freezes
what is alive at the start (``gc.freeze``) and unfreezes it at the end; a process that froze
its own heap, or disabled the collector, is left alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_owner = threading.local()
# Objects frozen before minicompile was imported: Python 3.12 keeps a few hundred objects
# in the permanent generation (375), put back there by each full collection after a
# gc.unfreeze().  More than these means someone froze the heap.
BASELINE = gc.get_freeze_count()


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Full collections inside skip the objects alive at entry (and at :func:`refreeze`)."""
    if (getattr(_owner, "active", False) or not gc.isenabled()
            or gc.get_freeze_count() > BASELINE):
        yield  # nested, the collector is off, or someone else froze the heap: theirs
        return
    gc.freeze()
    _owner.active = True
    try:
        yield
    finally:
        _owner.active = False
        gc.unfreeze()


def refreeze() -> None:
    """Inside :func:`frozen`: count what exists now (the compiler's modules, just imported)
    as old too."""
    if getattr(_owner, "active", False):
        gc.freeze()
