"""Whether the build tools work here: Triton (it imports) and the C++ compiler (it builds a
trivial shared library with our flags).  A tool that does not work gives one warning per
process, and the code runs on another way: the Triton backend's CPU graphs compile with
the C++ backend, the rest runs eagerly (minicompile/api.py decides).

Triton is probed once, on the first compile (not at ``import minicompile``: importing
Triton takes a sixth of a second).  An install whose import raises
something other than ImportError (a missing driver library, a version clash) is then
marked as not installed (``sys.modules["triton"] = None``), so every later ``import
triton`` raises ImportError: PyTorch's own checks (``torch._dynamo`` imports Triton and
expects only ImportError) and ours then see "not installed" instead of crashing.

The C++ compiler is probed only after a build fails, to tell a broken compiler (every
build would fail: one warning, and later builds are not attempted) from a kernel it
rejects (a bug of ours: that graph runs eagerly, with its own warning).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

_PROBE = 'extern "C" int mc_probe(int x) { return x + 1; }\n'
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """``warnings.warn(message)`` the first time ``key`` is met in this process."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=2)


@functools.lru_cache(maxsize=None)
def triton_problem() -> str | None:
    """None when Triton imports; else why it does not (and it is marked as missing)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure means Triton cannot be used
        for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
            del sys.modules[name]
        sys.modules["triton"] = None  # type: ignore[assignment]  # later imports: ImportError
        return f"{type(e).__name__}: {e}"
    return None


@functools.lru_cache(maxsize=None)
def cxx_problem(cxx: str, flags: tuple[str, ...]) -> str | None:
    """None when ``cxx`` builds a trivial shared library with ``flags``; else why not."""
    libs = [f for f in flags if f.startswith("-l")]
    with tempfile.TemporaryDirectory(prefix="minicompile-probe-") as folder:
        src = Path(folder) / "probe.cpp"
        src.write_text(_PROBE)
        cmd = [cxx, *[f for f in flags if not f.startswith("-l")], str(src), "-o",
               str(Path(folder) / "probe.so"), *libs]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return f"it cannot run: {e}"
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            return (f"it fails on a trivial program (exit status {proc.returncode})"
                    + (f": {detail[-1]}" if detail else ""))
    return None
