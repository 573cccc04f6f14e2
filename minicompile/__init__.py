"""minicompile: a small deep-learning compiler for PyTorch programs.

    @minicompile.compile
    def f(x, y):
        return torch.sin(x) + torch.sin(y)

The first call captures the function's bytecode into a graph, fuses it and generates Triton
(CUDA tensors) or C++ (CPU tensors) kernels; later calls whose guards pass run them directly.
"""

from minicompile.api import compile, reset, stats
from minicompile.errors import Unsupported
from minicompile.explain import explain

__all__ = ["compile", "explain", "reset", "stats", "Unsupported"]
__version__ = "0.1.0"
