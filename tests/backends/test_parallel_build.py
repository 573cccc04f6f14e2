"""C++ builds (minicompile/runtime/cpp_units.py): a graph's distinct kernels are built once
each, split over compiler processes that run at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import minicompile
from minicompile import config
from minicompile.runtime import build, cpp_units

UNIT = """#include <cmath>
static inline float helper(float x) { return x; }

// graph nodes: %1 sin
// source: a.py:1  torch.sin(x)
extern "C" void cpp_poi_sin_0(const float* in_ptr0, float* out_ptr0) {
    out_ptr0[0] = std::sin(in_ptr0[0]);
}

// graph nodes: %7 sin
// source: a.py:9  torch.sin(y)
extern "C" void cpp_poi_sin_1(const float* in_ptr0, float* out_ptr0) {
    out_ptr0[0] = std::sin(in_ptr0[0]);
}

// graph nodes: %8 cos
extern "C" void cpp_poi_cos_2(const float* in_ptr0, float* out_ptr0) {
    out_ptr0[0] = helper(std::cos(in_ptr0[0]));
}
"""


def test_split_names_identical_kernels_once() -> None:
    units = cpp_units.split(UNIT, parts=8)
    assert len(units.sources) == 2  # two distinct kernels, one unit each
    sin0, sin1, cos = (units.symbols[f"cpp_poi_{n}"] for n in ("sin_0", "sin_1", "cos_2"))
    assert sin0 == sin1 and sin0 != cos
    for index, symbol in (sin0, cos):
        source = units.sources[index]
        assert f'extern "C" void {symbol}(' in source and "helper(float x)" in source
        assert "// graph nodes" not in source
    (one,) = cpp_units.split(UNIT, parts=1).sources
    assert one.count('extern "C" void') == 2


def blocks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(12):
        x = x + F.gelu(F.layer_norm(x, (x.shape[-1],)) @ w)
    return x


def test_twelve_identical_blocks_build_each_kernel_once() -> None:
    with config.patch(compile_threads=2):
        compiled = minicompile.compile(blocks, backend="cpp")
        for seed in (0, 1):
            torch.manual_seed(seed)
            x, w = torch.randn(16, 64), torch.randn(64, 64) * 0.1
            torch.testing.assert_close(compiled(x, w), blocks(x, w), rtol=1e-4, atol=1e-4)
    (loaded,) = [v for v in build._loaded.values() if len(v.symbols) >= 12]
    distinct = set(loaded.symbols.values())
    assert minicompile.stats()["kernels"] == len(loaded.symbols)
    assert len(distinct) <= 4, distinct  # layer norm, gelu + residual: once, not 12 times
    assert len(loaded.lib_paths) == 2  # built by two compiler processes
