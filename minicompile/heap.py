"""Keep Python's cyclic garbage collector off the heap that exists before a compile.

A cold compile allocates hundreds of thousands of small objects (graph nodes, sympy
expressions, metadata, generated code), so CPython runs its full collection during it, and
each one walks every object in the process: PyTorch's, sympy's, the user's model (on a
two-core CPU, nanoGPT's cold call ran three of them, 0.28 s in all; resnet50's, before its
guards and metadata got cheaper, 0.5 s of 1.8 s).  :func:`frozen` moves
the objects alive when the compile starts into the permanent generation (``gc.freeze``)
and puts them back when it ends (``gc.unfreeze``): collections during the compile walk only
what the compile made, and still free its cyclic garbage.  Nothing changes for objects
freed by reference counting, which is almost all of them.

A process that froze its own heap (a server after its imports) keeps it: with more objects
frozen than when minicompile was imported, or with the collector disabled, this does
nothing.
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
