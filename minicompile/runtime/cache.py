"""The on-disk cache: generated code and built libraries, keyed by a hash of their source
and the tool versions, written atomically so concurrent processes never see half a file."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


@functools.lru_cache(maxsize=None)
def tool_versions(cxx: str) -> str:
    """Everything that changes what a source file builds to."""
    parts = [f"python={sys.version}", f"torch={torch.__version__}", f"machine={platform.machine()}"]
    try:
        import triton

        parts.append(f"triton={triton.__version__}")
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        parts.append("triton=none")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        parts.append(f"cxx={out.stdout.splitlines()[0] if out.stdout else cxx}")
    except (OSError, subprocess.SubprocessError):
        parts.append(f"cxx={cxx}:missing")
    return "\n".join(parts)


def cache_key(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
