"""minicompile: a small deep-learning compiler for PyTorch programs.

    @minicompile.compile
    def f(x, y):
        return torch.sin(x) + torch.sin(y)

The first call captures the function's bytecode into a graph, fuses it and generates Triton
(CUDA tensors) or C++ (CPU tensors) kernels; later calls whose guards pass run them directly.
"""

import importlib.util as _importlib_util
import os as _os

# passes/ and codegen/ install as minicompile.passes and minicompile.codegen (setup.cfg's
# package_dir).  Imported from a source checkout (setup.cfg beside this package), they are
# that checkout's own, even where another checkout is installed editable.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "setup.cfg")) or (
    _importlib_util.find_spec("minicompile.codegen") is None
):
    __path__.append(_root)

from minicompile.api import compile, reset, stats  # noqa: E402
from minicompile.errors import Unsupported  # noqa: E402
from minicompile.explain import explain  # noqa: E402
from minicompile.aot_export import export, load  # noqa: E402
from minicompile.runtime.cache_limits import cache_info, clear_cache  # noqa: E402
from minicompile.runtime.profile import profile_report  # noqa: E402


# mark_dynamic lives beside capture, which imports sympy and PyTorch's fake tensors: it is
# imported when first used, so `import minicompile` stays cheap.
def mark_dynamic(t: object, dim: int | list[int] | tuple[int, ...]) -> None:
    """Mark dimension(s) ``dim`` of tensor ``t`` dynamic ahead of the first call (see
    minicompile.capture.dynamic.mark_dynamic)."""
    from minicompile.capture.dynamic import mark_dynamic as mark

    mark(t, dim)


__all__ = [
    "cache_info", "clear_cache", "compile", "explain", "export", "load", "mark_dynamic",
    "profile_report", "reset", "stats", "Unsupported",
]
__version__ = "0.1.0"
