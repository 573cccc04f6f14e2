"""Kernel text, without a GPU and without building: hand-built graphs through the passes,
lowering, fusion and ``codegen.wrapper.generate``; the tests read the generated source."""

from __future__ import annotations

import ast
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

from minicompile import op_table, ops
from minicompile.codegen import cpp, triton
from minicompile.codegen.common import CodeWriter
from minicompile.codegen.printers import cpp_index, triton_index
from minicompile.errors import SourceLine
from minicompile.sym import FloorDiv, ModularIndexing, index_symbol

from graph_builder import Compiled, GraphBuilder, compile_graph_text

import minicompile

POINTWISE_FAMILIES = ("unary", "binary", "ternary")


def chain(shape: tuple = (4, 8), dtype: torch.dtype = torch.float32) -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("L_x", shape, dtype)
    src = SourceLine("/home/user/model.py", 12, "f", "    a = torch.sin(x)")
    a = b("sin", x, stack=(src,))
    b.output(b("sin", a, stack=(SourceLine("/home/user/model.py", 13, "f", "return a.sin()"),)))
    return b


def triton_kernels(c: Compiled) -> list[str]:
    """The texts of the generated kernels (helpers excluded), split at ``@triton.jit``."""
    parts = c.code.module.split("@triton.jit\n")[1:]
    return [p for p in parts if re.match(r"def triton_", p)]


def cpp_kernels(c: Compiled) -> list[str]:
    src = c.code.cpp_source
    return [m.group(0) for m in re.finditer(r'extern "C" void \w+\(.*?\n\}\n', src, re.S)]


# -- Triton ---------------------------------------------------------------------------------


def test_triton_chain_is_one_tutorial_shaped_kernel() -> None:
    c = compile_graph_text(chain().graph, "triton")
    assert len(c.code.kernels) == 1
    (kernel,) = triton_kernels(c)
    assert c.code.module.count("@triton.jit") == 1  # no helper needed by sin
    assert re.search(r"def triton_poi_sin_0\(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr\)",
                     kernel)
    for needle in ("xindex = ", "tl.program_id(0)", "tl.load(", "tl.store("):
        assert needle in kernel, needle
    # 32 elements fill whole blocks: no mask, as Inductor does for such sizes.
    assert "xmask" not in kernel and "no mask" in kernel
    assert kernel.count("libdevice.sin(") == 2
    assert kernel.count("tl.load(") == 1 and kernel.count("tl.store(") == 1


def test_triton_kernel_comment_names_nodes_and_sources() -> None:
    c = compile_graph_text(chain().graph, "triton")
    (kernel,) = triton_kernels(c)
    comments = [line.strip() for line in kernel.splitlines() if line.strip().startswith("#")]
    assert comments[0] == "# graph nodes: %1 sin, %2 sin"
    assert "# source: model.py:12  a = torch.sin(x)" in comments
    assert "# source: model.py:13  return a.sin()" in comments


def test_triton_module_is_valid_python_with_a_call_function() -> None:
    c = compile_graph_text(chain().graph, "triton")
    tree = ast.parse(c.code.module)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"triton_poi_sin_0", "call"} <= names
    assert "triton_poi_sin_0[(1,)](arg0, buf0, 32, XBLOCK=" in c.code.module
    assert "empty_strided_cpu((4, 8), (8, 1), torch.float32)" in c.code.module  # CPU tensors
    assert c.code.cpp_source is None


def test_triton_low_precision_computes_in_float32() -> None:
    c = compile_graph_text(chain(dtype=torch.float16).graph, "triton")
    (kernel,) = triton_kernels(c)
    assert ".to(tl.float32)" in kernel  # loads widen
    assert ".to(tl.float16)" in kernel  # each op rounds back, as eager does


def test_triton_transposed_input_splits_xindex() -> None:
    b = GraphBuilder()
    x = b.input("L_x", torch.empty(8, 6).T)  # [6, 8], strides (1, 6)
    y = b.input("L_y", (6, 8))
    b.output(b("add", x, y))
    c = compile_graph_text(b.graph, "triton")
    (kernel,) = triton_kernels(c)
    assert "(xindex // " in kernel and "(xindex % " in kernel


def test_triton_zero_dim_and_empty() -> None:
    b = GraphBuilder()
    x = b.input("L_x", ())
    y = b.input("L_y", (0, 4))
    b.output(b("exp", x), b("exp", y))
    c = compile_graph_text(b.graph, "triton")
    assert "xindex * 0 + 0" in c.code.module  # a 0-dim store is one element
    assert "nothing to compute for an empty tensor" in c.code.module


def test_triton_helpers_are_emitted_only_when_used() -> None:
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8)), b.input("L_y", (4, 8))
    b.output(b("maximum", x, y))
    c = compile_graph_text(b.graph, "triton")
    assert "def mc_maximum(" in c.code.module
    assert "def mc_floordiv(" not in c.code.module
    ast.parse(c.code.module)


# -- C++ ------------------------------------------------------------------------------------


def test_cpp_chain_is_one_extern_c_kernel() -> None:
    c = compile_graph_text(chain().graph, "cpp")
    assert len(c.code.kernels) == 1
    (kernel,) = cpp_kernels(c)
    assert kernel.startswith('extern "C" void cpp_poi_sin_0(')
    assert "const float* __restrict__ in_ptr0" in kernel
    assert kernel.count("std::sin(") == 2
    assert "// graph nodes: %1 sin, %2 sin" in c.code.cpp_source
    assert "// source: model.py:12  a = torch.sin(x)" in c.code.cpp_source
    ast.parse(c.code.module)
    assert "lib.cpp_poi_sin_0" in c.code.module


def test_cpp_large_kernel_uses_openmp() -> None:
    c = compile_graph_text(chain(shape=(256, 256)).graph, "cpp")
    (kernel,) = cpp_kernels(c)
    assert "#pragma omp parallel for" in kernel


def test_cpp_inner_loop_is_simd() -> None:
    b = GraphBuilder()
    x = b.input("L_x", torch.empty(8, 6).T)
    y = b.input("L_y", (6, 8))
    b.output(b("mul", x, y))
    c = compile_graph_text(b.graph, "cpp")
    (kernel,) = cpp_kernels(c)
    assert "#pragma omp" in kernel
    assert kernel.count("for (int64_t") == 2


def test_cpp_half_is_stored_as_uint16() -> None:
    c = compile_graph_text(chain(dtype=torch.bfloat16).graph, "cpp")
    (kernel,) = cpp_kernels(c)
    assert "const uint16_t* __restrict__ in_ptr0" in kernel
    assert "mc_bf16_to_float(" in kernel and "mc_float_to_bf16(" in kernel


# -- both backends ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_sibling_outputs_are_one_kernel(backend: str) -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    b.output(b("sin", x), b("cos", x))
    c = compile_graph_text(b.graph, backend)
    assert len(c.code.kernels) == 1
    assert "out_ptr1" in (c.code.cpp_source or c.code.module)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_alias_outputs_have_no_kernel(backend: str) -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    b.output(x, b("permute", x, (1, 0)))
    c = compile_graph_text(b.graph, backend)
    assert c.code.kernels == ()
    assert "return (arg0, arg0.as_strided((8, 4), (1, 8)))" in (
        c.code.module
    )


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(n for n, d in ops.OPS.items()
                                        if d.family in POINTWISE_FAMILIES))
def test_every_pointwise_op_generates_valid_text(backend: str, name: str) -> None:
    family = ops.OPS[name].family
    b = GraphBuilder()
    if name in op_table.LOGICAL or name.startswith("bitwise"):
        dtype = torch.bool if name.startswith("logical") else torch.int32
    else:
        dtype = torch.float32
    x, y = b.input("L_x", (4, 8), dtype), b.input("L_y", (4, 8), dtype)
    if family == "unary":
        out = b(name, x)
    elif family == "binary":
        out = b(name, x, y)
    else:
        out = b(name, b("gt", x, y), x, y)
    b.output(out)
    c = compile_graph_text(b.graph, backend)
    assert len(c.code.kernels) == 1
    ast.parse(c.code.module)
    if backend == "cpp":
        assert c.code.cpp_source.count("{") == c.code.cpp_source.count("}")


def test_op_tables_are_complete() -> None:
    """Every pointwise op of minicompile.ops is a row of op_table, and every layer reads its
    column: capture its spellings, passes/derivatives its rule, both backends a template for
    it and for each variant, the Triton interpreter each libdevice function the templates
    and helpers call."""
    from minicompile.capture import torch_ops
    from minicompile.op_table import BY_NAME, COMPARISONS, IDENTITY, LOGICAL, ROWS
    from minicompile.passes import derivatives
    from minicompile.runtime import triton_interp

    pointwise = {n for n, d in ops.OPS.items() if d.family in POINTWISE_FAMILIES}
    assert pointwise and pointwise <= set(BY_NAME), sorted(pointwise - set(BY_NAME))
    for table in (triton.TRITON_OPS, cpp.CPP_OPS):
        assert set(BY_NAME) <= set(table), sorted(set(BY_NAME) - set(table))
    for row in ROWS:
        for variant in row.variants.values():
            assert variant == IDENTITY or variant in BY_NAME, (row.name, variant)
        for spelling in row.spellings:  # a function of this PyTorch that capture maps
            namespace, _, attr = spelling.rpartition(".")
            fn = getattr(torch_ops._NAMESPACES[namespace], attr, None)
            assert fn is None or fn in torch_ops.FUNCTIONS, spelling
        if row.family == "unary":  # by its spellings or a handler of its own (round)
            assert row.eager in torch_ops.FUNCTIONS, row.name
        elif row.family == "binary":
            assert row.spellings or row.name in torch_ops.OPERATORS.values(), row.name
        # A derivative exactly where float operands give a float result.
        floating = row.family != "variant" and row.name not in COMPARISONS | LOGICAL
        floating = floating and not row.name.startswith("bitwise")
        assert (row.name in derivatives.RULES) == floating, row.name
        if row.simd:  # libmvec's declared name, called directly or by a helper's doubles
            assert row.cpp == f"std::{row.name}({{0}})" or (
                row.cpp == f"mc_{row.name}({{0}})"
                and f"std::{row.name}(x)" in cpp.HELPERS[f"mc_{row.name}"]), row.name
    called = re.findall(r"libdevice\.(\w+)\(", "".join(triton.TRITON_OPS.values())
                        + "".join(triton.HELPERS.values()))
    missing = {f for f in called if not hasattr(triton_interp.libdevice, f)}
    assert called and not missing, sorted(missing)


def test_dtype_tables_cover_the_graph_dtypes() -> None:
    from minicompile.graph import DTYPE_ABBR

    assert set(DTYPE_ABBR) <= set(triton.TRITON_DTYPES)
    assert set(DTYPE_ABBR) <= set(cpp.CPP_DTYPES)


# -- the shared pieces -----------------------------------------------------------------------


def test_code_writer_indents_and_braces() -> None:
    w = CodeWriter()
    w.line("def f():")
    with w.indent():
        w.line("return 1")
    with w.block("void g()"):
        w.line("return;")
    w.line()
    assert w.text() == "def f():\n    return 1\nvoid g() {\n    return;\n}\n\n"


def test_index_printers() -> None:
    x = index_symbol("xindex")
    assert triton_index(FloorDiv(x, 6)) == "(xindex // 6)"
    assert cpp_index(FloorDiv(x, 6)) == "(xindex / 6)"
    assert triton_index(ModularIndexing(x, 1, 6)) == "(xindex % 6)"
    assert triton_index(ModularIndexing(x, 6, 4)) == "((xindex // 6) % 4)"
    x0, x1 = index_symbol("x0"), index_symbol("x1")
    assert triton_index(8 * x0 + x1) == "x1 + 8*x0" or triton_index(8 * x0 + x1) == "8*x0 + x1"
    assert triton_index(sympy.Integer(0)) == "0"
    assert "-" in cpp_index(x0 - x1)


def test_sym_simplifies() -> None:
    x = index_symbol("x")
    assert FloorDiv(x, 1) == x
    assert FloorDiv(sympy.Integer(13), sympy.Integer(4)) == 3
    assert FloorDiv(FloorDiv(x, 2), 3) == FloorDiv(x, 6)
    assert FloorDiv(4 * x + 8, 4) == x + 2
    assert ModularIndexing(x, 3, 1) == 0
    assert ModularIndexing(sympy.Integer(14), 3, 4) == 0


def test_triton_masks_a_partial_last_block() -> None:
    """A size that does not fill whole blocks masks every load and store."""
    (kernel,) = triton_kernels(compile_graph_text(chain((3, 7)).graph, "triton"))
    assert "xmask = xindex < xnumel" in kernel
    assert kernel.count(", xmask)") == 2  # the load and the store


# -- index expressions (iota), from argmax --------------------------------------------------


def argmax_graph() -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("L_x", (4, 33))
    b.output(b(ops.extern_op(torch.argmax), x, 1))
    return b


def test_argmax_is_one_kernel_reading_its_position_as_int64() -> None:
    t = compile_graph_text(argmax_graph().graph, "triton")
    (kernel,) = triton_kernels(t)
    assert "(r0).to(tl.int64)" in kernel  # the iota: the row position, never loaded
    assert kernel.count("tl.load(") == 1 and kernel.count("tl.reduce(") == 2
    c = compile_graph_text(argmax_graph().graph, "cpp")
    (kernel,) = cpp_kernels(c)
    assert re.search(r"int64_t tmp\d+ = r0;", kernel), kernel
    for compiled in (t, c):
        assert "torch.argmax" not in compiled.code.module
        assert "iota" in str(compiled.graph) and "index(r0)" in str(compiled.program)


# -- cat: a piecewise read of the inputs, each piece masked by its position --------------------


def cat_of_sin(dim: int = 1) -> GraphBuilder:
    """``torch.cat([x.sin(), y], dim).relu()`` over x [4, 3] and y [4, 5] (dim 1)."""
    b = GraphBuilder()
    x = b.input("L_x", (4, 3))
    y = b.input("L_y", (4, 5) if dim in (1, -1) else (2, 3))
    c = b(ops.extern_op(torch.cat), [b("sin", x), y], dim)
    b.output(b("relu", c))
    return b


def test_cat_is_one_kernel_without_a_library_call(backend: str) -> None:
    c = compile_graph_text(cat_of_sin().graph, backend)
    assert len(c.code.kernels) == 1
    assert "torch.cat(" not in c.code.module
    assert "cat(i1; [0, 3): sin(load(arg0" in str(c.program), str(c.program)


def test_triton_cat_pieces_mask_every_load_by_their_condition() -> None:
    (kernel,) = triton_kernels(compile_graph_text(cat_of_sin().graph, "triton"))
    conditions = dict(re.findall(r"(tmp\d+) = (\(x1 [<>]=? 3\))", kernel))
    assert sorted(conditions.values()) == ["(x1 < 3)", "(x1 >= 3)"], kernel
    loads = [line for line in kernel.splitlines() if "tl.load(" in line]
    assert len(loads) == 2, kernel
    for line, cond in zip(loads, conditions):
        # The piece's condition is in the load's mask: a shifted index outside the piece is
        # never read, and masked lanes read 0.
        assert re.search(rf"tl\.load\(in_ptr\d \+ \([^)]*\), [^)]*\b{cond}\b[^)]*, other=0\)",
                         line), line
    assert "tl.where(" in kernel and "# cat piece 1: x1 in [3, end)" in kernel


def test_triton_cat_along_dim0_masks_the_row_condition() -> None:
    (kernel,) = triton_kernels(compile_graph_text(cat_of_sin(dim=0).graph, "triton"))
    assert "(x0 < 4)" in kernel and "(x0 >= 4)" in kernel, kernel
    assert re.search(r"tl\.load\(in_ptr1 \+ \(3\*x0 \+ x1 - 12\), xmask & tmp\d+, other=0\)",
                     kernel), kernel


def test_cpp_cat_evaluates_only_the_taken_piece() -> None:
    # along the outer dim: an if / else on the position, each branch reading its input
    (kernel,) = cpp_kernels(compile_graph_text(cat_of_sin(dim=0).graph, "cpp"))
    assert "if (x0 < 4) {" in kernel and "else {" in kernel, kernel
    branch = kernel[kernel.index("if (x0 < 4) {"):kernel.index("else {")]
    assert "std::sin(" in branch and "in_ptr0[" in branch, kernel
    assert "in_ptr1" not in branch  # the second input is read in its own branch only


def test_cpp_cat_along_the_inner_dim_splits_the_loop() -> None:
    """A cat along the innermost loop is one loop per piece, without a branch (so the
    compiler vectorises each); each loop reads only its piece's input."""
    (kernel,) = cpp_kernels(compile_graph_text(cat_of_sin().graph, "cpp"))
    assert "if (" not in kernel, kernel
    first = kernel.index("for (int64_t x1 = 0; x1 < 3; ++x1)")
    second = kernel.index("for (int64_t x1 = 3; x1 < 8; ++x1)")
    assert "std::sin(in_ptr0" in kernel[first:second] or "in_ptr0[" in kernel[first:second]
    assert "in_ptr1" not in kernel[first:second] and "in_ptr0" not in kernel[second:], kernel



def stacked_rows(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple:
    """q, k and v gradients stacked into a fused projection's rows ([n, 3 * d]: a cat along a
    dim the reshape merged into the row's), the rows and each row's sum."""
    rows = torch.cat([x.unsqueeze(1), y.unsqueeze(1), z.unsqueeze(1)], 1).reshape(8, -1)
    return rows.exp(), rows.sum(1)


def test_cpp_cat_along_a_merged_dim_splits_a_reduction_kernels_loop() -> None:
    """In a reduction kernel, a per-element output of a cat along ``r0 // 16`` is one loop
    per piece, without a branch (vit_tiny's q/k/v gradients took 2.5x as long with it); the
    reduction over the row still reads every piece.  Values as eager's, two calls."""
    b = GraphBuilder()
    args = [b.input(f"L_{n}", (8, 16)) for n in "xyz"]
    cat = b(ops.extern_op(torch.cat), [b("unsqueeze", a, 1) for a in args], 1)
    rows = b("reshape", cat, (8, 48))
    b.output(b("exp", rows), b("sum", rows, [1], False))
    (kernel,) = cpp_kernels(compile_graph_text(b.graph, "cpp"))
    assert "if (" not in kernel.split("acc0 +=")[-1], kernel
    for lo, hi in ((0, 16), (16, 32), (32, 48)):
        assert f"for (int64_t r0 = {lo}; r0 < {hi}; ++r0)" in kernel, kernel
    compiled = minicompile.compile(stacked_rows, backend="cpp")
    for _ in range(2):  # fresh values each call
        inputs = [torch.randn(8, 16) for _ in range(3)]
        for got, want in zip(compiled(*inputs), stacked_rows(*inputs), strict=True):
            torch.testing.assert_close(got, want)


def padded_twice(sample: torch.Tensor) -> GraphBuilder:
    b = GraphBuilder()
    b.output(b("mul", b(ops.extern_op(F.pad), b.input("L_x", sample), (1, 1, 1, 1)), 2.0))
    return b


def test_a_pad_fuses_only_along_the_contiguous_dim() -> None:
    """F.pad is a cat fused into its readers (lowering.lower_pad) where it pads the dim of
    unit stride; padding only dims outside it (a channels-last image's rows and columns), it
    is the library call, written once: a branch per element in the readers' vectorised
    loop cost the channels-last depthwise weight gradients 4-10% of a train step."""
    text = compile_graph_text(padded_twice(torch.empty(2, 8, 6, 6)).graph, "cpp").code
    assert "torch.nn.functional.pad(" not in text.module
    channels_last = torch.empty(2, 8, 6, 6).to(memory_format=torch.channels_last)
    text = compile_graph_text(padded_twice(channels_last).graph, "cpp").code
    assert "torch.nn.functional.pad(" in text.module


def transposed_residual_norm(x: torch.Tensor, y: torch.Tensor) -> tuple:
    """mlp_mixer's second norm of a block: the residual after its token mixing (read
    transposed), kept, and its layer norm."""
    z = x + y.transpose(1, 2)
    return z, F.layer_norm(z, (64,))


def test_cpp_a_row_gathered_once_is_read_back_by_the_later_passes() -> None:
    """A layer norm's operand that gathers along the row (``y`` read transposed: stride 8)
    is stored in its unit-stride output by the mean's pass; the variance's and the last
    pass read that back (cpp_reduction.kept_operands), so ``y`` is read once.  Values as
    eager's, two calls."""
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8, 64)), b.input("L_y", (4, 64, 8))
    z = b("add", x, b("permute", y, (0, 2, 1)))
    b.output(z, b(ops.extern_op(F.layer_norm), z, (64,)))
    (kernel,) = cpp_kernels(compile_graph_text(b.graph, "cpp"))
    gathers = re.findall(r"in_ptr1\[[^\]]*8\*r0[^\]]*\]", kernel)
    assert len(gathers) == 1, kernel
    assert kernel.count("out_ptr0[") == 3, kernel  # stored once, read back twice
    compiled = minicompile.compile(transposed_residual_norm, backend="cpp")
    for _ in range(2):
        args = (torch.randn(4, 8, 64), torch.randn(4, 64, 8))
        for got, want in zip(compiled(*args), transposed_residual_norm(*args), strict=True):
            torch.testing.assert_close(got, want)
