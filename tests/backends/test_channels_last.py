"""Channels-last convolutions (passes/layout.py), forced on: CPU tensors, and CUDA ones
for the Triton backend on a machine with a GPU.

Every compiled call is compared with eager on values and strides (outputs, and the
gradients of inputs and parameters), twice with fresh inputs; the loop program printed by
the ``fusion`` log shows that convolutions read and write channels-last and that the
pointwise kernels around them do too.  Strides are compared along the dims longer than 1
(PyTorch's own layout contract for gradients: the others are never stepped along).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minicompile
from minicompile import config, ops
from minicompile.config import from_env
from minicompile.passes.layout import decide, optimize_layout

from devices import device_for
from graph_builder import GraphBuilder


@pytest.fixture(autouse=True)
def _no_tf32() -> object:
    """cuDNN's float32 convolutions in float32 (no TF32) on the GPU: NCHW and NHWC kernels
    then agree to float32 rounding, as on the CPU."""
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
        yield


def forced() -> object:
    """layout_opt forced on; the graphs and loop programs logged (read with capsys).  The
    convolutions stay F.conv2d calls (not oneDNN's on packed weights: passes/onednn_conv.py,
    tests/passes/test_onednn_conv.py)."""
    return config.patch(layout_opt="channels_last", onednn=False,
                        logs=frozenset({"fusion", "graph"}))


def strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def assert_like_eager(actual: torch.Tensor, expected: torch.Tensor, **tol: float) -> None:
    torch.testing.assert_close(actual, expected, **tol)
    assert strides(actual) == strides(expected), (actual.stride(), expected.stride())


def is_channels_last(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """(A 1x1 image, or a single channel, is both channels-last and contiguous.)"""
    t = torch.empty_strided(shape, stride, device="meta")
    return t.is_contiguous(memory_format=torch.channels_last)


BUFFER = re.compile(r"^(\w+): \w+\[([^\]]*)\] stride \(([^)]*)\)(?: = (.*))?$")


def programs(err: str) -> list[dict[str, tuple]]:
    """Each loop program of the ``fusion`` log: buffer -> (shape, stride, body); the
    returned names under ``"return"``."""
    found = []
    for block in err.split("======== minicompile fusion: ")[1:]:
        buffers: dict[str, tuple] = {}
        for line in block.splitlines()[1:]:
            line = line.removeprefix("input ")
            m = BUFFER.match(line)
            if m:
                shape = tuple(int(v) for v in m.group(2).split(", ") if v)
                stride = tuple(int(v) for v in m.group(3).split(", ") if v)
                buffers[m.group(1)] = (shape, stride, m.group(4) or "input")
            elif line.startswith("return "):
                buffers["return"] = tuple(n.strip() for n in line[7:].split(","))
                break
        found.append(buffers)
    return found


def check_channels_last(err: str, convolutions: int, copies_back: int = 0) -> None:
    """The first (forward) program: every convolution reads a channels-last input and
    weight (or a 1x1 one, which is both) and writes channels-last, and every 4-d kernel
    buffer with an image larger than 1x1 is channels-last, except the graph's outputs and
    ``copies_back`` copies to eager's layout for other reasons."""
    program = programs(err)[0]
    returned = program.pop("return")
    convs = {name: body for name, (_, _, body) in program.items()  # (training: record(...))
             if re.match(r"extern (minicompile\.runtime\.autograd\.record\(')?"
                         r"torch\.nn\.functional\.conv2d", body)}
    assert len(convs) == convolutions, convs
    for name, body in convs.items():
        assert is_channels_last(*program[name][:2]), (name, program[name])
        x, w = re.findall(r"\b(?:buf|arg)\d+\b", body)[:2]
        assert is_channels_last(*program[x][:2]), (x, program[x])
        shape, stride, _ = program[w]
        assert is_channels_last(shape, stride) or shape[2:] == (1, 1), (w, program[w])
    kernels = [n for n, (shape, _, body) in program.items()
               if n.startswith("buf") and not body.startswith("extern") and len(shape) == 4
               and shape[1] > 1 and shape[2] * shape[3] > 1 and n not in returned]
    assert kernels
    others = [(n, program[n]) for n in kernels if not is_channels_last(*program[n][:2])]
    assert len(others) == copies_back, others


class ConvBnRelu(nn.Module):
    def __init__(self, cin: int = 4, cout: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Residual(nn.Module):
    """A ResNet basic block with a 1x1 projection shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.a = ConvBnRelu(4, 8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.shortcut = nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(self.a(x))) + self.shortcut(x))


def _fresh(model: nn.Module, train: bool, backend: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = model.train(train).to(device_for(backend))
    with torch.no_grad():  # batch norm statistics that are not the identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model, copy.deepcopy(model)


def run_inference(model: nn.Module, backend: str, inputs: list[torch.Tensor]) -> None:
    eager, twin = _fresh(model, False, backend)
    inputs = [x.to(device_for(backend)) for x in inputs]
    compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
    with torch.no_grad():
        for x in inputs:
            assert_like_eager(compiled(x), eager(x), rtol=1e-4, atol=1e-4)


def run_training(model: nn.Module, backend: str, inputs: list[torch.Tensor]) -> None:
    """Gradients are compared at the scale of the largest one, as in
    tests/models/test_training_models.py (batch norm on 2 images amplifies rounding), and
    more loosely: mkldnn's channels-last and NCHW convolutions sum in other orders (on an
    AVX-512 host, resnet18's gradients differed by 1e-3 of the largest one)."""
    eager, twin = _fresh(model, True, backend)
    inputs = [x.to(device_for(backend)) for x in inputs]
    compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
    for x in inputs:
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected, actual = eager(x1), compiled(x2)
        assert_like_eager(actual, expected, rtol=1e-4, atol=1e-4)
        expected.square().mean().backward()
        actual.square().mean().backward()
        pairs = [(x2.grad, x1.grad)] + [(q.grad, p.grad) for p, q in
                                        zip(eager.parameters(), twin.parameters())]
        scale = max(e.abs().max().item() for _, e in pairs)
        for a, e in pairs:
            # cuDNN's channels-last weight gradients: up to 0.6% of the largest gradient
            # away from the NCHW ones (why "auto" leaves training graphs alone on CUDA).
            cudnn = 1e-2 if a.is_cuda else 2e-3
            assert_like_eager(a, e, rtol=1e-3, atol=cudnn * scale)
        for (name, b), c in zip(eager.named_buffers(), twin.buffers()):
            torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=name)
        eager.zero_grad()
        twin.zero_grad()


def images(*shapes: tuple[int, ...], channels_last: bool = False) -> list[torch.Tensor]:
    xs = [torch.randn(shape) for shape in shapes]
    if channels_last:
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    return xs


# -- inference ------------------------------------------------------------------------------


def test_conv_bn_relu_runs_channels_last(backend: str, capsys: pytest.CaptureFixture) -> None:
    with forced():
        run_inference(ConvBnRelu(), backend, images((2, 4, 8, 8), (2, 4, 8, 8)))
    err = capsys.readouterr().err
    assert "channels-last convolutions: layout_opt is 'channels_last'" in err
    check_channels_last(err, convolutions=1)
    program = programs(err)[0]
    # The batch norm is folded into the convolution, whose weight is copied channels-last
    # once (passes/hoist_params.py): one kernel copies the input, and ReLU runs in the
    # kernel that writes the output in eager's (NCHW) strides: no separate copy back.
    (out,) = program["return"]
    assert program[out][1] == (512, 64, 8, 1)
    assert "to_eager_layout" in err and minicompile.stats()["kernels"] == 2, program


def test_residual_block_runs_channels_last(backend: str, capsys: pytest.CaptureFixture) -> None:
    with forced():
        run_inference(Residual(), backend, images((2, 4, 8, 8), (2, 4, 8, 8)))
    check_channels_last(capsys.readouterr().err, convolutions=3)


def test_channels_last_inputs_give_channels_last_outputs(backend: str) -> None:
    """As eager: a channels-last image in, channels-last out (no copy of the input)."""
    with forced():
        run_inference(Residual(), backend, images((2, 4, 8, 8), (3, 4, 8, 8),
                                                  channels_last=True))


def test_a_convolution_returned_directly_is_copied_to_eager_layout(
    backend: str, capsys: pytest.CaptureFixture
) -> None:
    """The convolution's result, a slice of it (rebuilt as a view of the first output, as
    eager's) and its ReLU come back in eager's strides: two copies back, the ReLU's in
    the ReLU's kernel."""
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.conv2d(x, w, padding=1)
        return y, y[:, :2], y.relu()

    with forced():
        compiled = minicompile.compile(f, backend=backend)
        for _ in range(2):
            x, w = (torch.randn(shape, device=device_for(backend))
                    for shape in ((2, 3, 6, 6), (4, 3, 3, 3)))
            for a, e in zip(compiled(x, w), f(x, w)):
                assert_like_eager(a, e, rtol=1e-5, atol=1e-5)
                assert a.stride() == e.stride()
    err = capsys.readouterr().err
    assert "channels-last convolutions" in err and "could not" not in err
    assert err.count("= to_eager_layout(") == 2


def test_a_call_that_reads_strides_keeps_eager_layout(capsys: pytest.CaptureFixture) -> None:
    """as_strided of a convolution's result reads its memory: the graph keeps eager's
    layout (a channels-last result would give other values)."""
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(F.conv2d(x, w, padding=1), (2, 8), (1, 2)) * 2

    with forced():
        compiled = minicompile.compile(f, backend="cpp")
        for _ in range(2):
            x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
            assert_like_eager(compiled(x, w), f(x, w))
    assert "eager layout: could not lay the graph out channels-last (torch.as_strided reads" in (
        capsys.readouterr().err)


def test_convolution_of_a_channels_last_input_has_eager_strides(backend: str) -> None:
    """Without the layout pass too: a convolution's result layout follows its device's
    rules (CPU: channels-last in, channels-last out), not the meta device's."""
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, padding=1).relu()

    with config.patch(layout_opt="off"):
        compiled = minicompile.compile(f, backend=backend)
        for x in images((2, 3, 8, 8), (2, 3, 8, 8), channels_last=True):
            x, w = x.to(device_for(backend)), torch.randn(4, 3, 3, 3, device=device_for(backend))
            assert_like_eager(compiled(x, w), f(x, w))
            assert compiled(x, w).stride() == f(x, w).stride()


def relaid(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.contiguous(memory_format=torch.channels_last) * 2,
            x.to(memory_format=torch.channels_last),
            x.to(torch.float64, memory_format=torch.channels_last),
            x.unsqueeze(-1).contiguous(memory_format=torch.channels_last_3d))


def test_memory_formats_are_captured(backend: str) -> None:
    """``x.contiguous(memory_format=...)`` and ``x.to(memory_format=...)`` are graph ops, no
    graph break: ``x`` itself where eager returns it, else a copy in eager's strides (single
    channels and 1x1 images included), on contiguous, channels-last and transposed input,
    twice with fresh values; channels-last of a 3-d tensor is eager's error."""
    compiled = minicompile.compile(relaid, backend=backend, fullgraph=True)
    for shape in ((2, 3, 4, 5), (2, 1, 4, 4), (2, 3, 1, 1)):
        for x in images(shape, shape, channels_last=True) + images(shape, shape):
            for x in (x.to(device_for(backend)), x.to(device_for(backend)).transpose(1, 2)):
                got, want = compiled(x), relaid(x)
                for a, e in zip(got, want, strict=True):
                    torch.testing.assert_close(a, e)
                    assert a.stride() == e.stride() and a.dtype == e.dtype
                assert (got[1] is x) == (want[1] is x)
    with pytest.raises(RuntimeError, match="channels_last"):
        minicompile.compile(lambda x: x.contiguous(memory_format=torch.channels_last) + 1,
                            backend=backend)(torch.randn(3, 4, 5, device=device_for(backend)))


def conv_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w, padding=1).relu()


def test_warm_entries_keep_their_layout(tmp_path: object, backend: str) -> None:
    """A new process (a fresh wrapper after reset) loads the channels-last entry; one made
    with another layout_opt compiles its own."""
    stats = []
    with config.patch(warm_entries=True, cache_dir=tmp_path, layout_opt="channels_last"):
        for layout_opt in ("channels_last", "channels_last", "off"):
            minicompile.reset()
            with config.patch(layout_opt=layout_opt):
                compiled = minicompile.compile(conv_relu, backend=backend)
            for _ in range(2):
                x, w = (torch.randn(shape, device=device_for(backend))
                        for shape in ((2, 3, 8, 8), (4, 3, 3, 3)))
                assert_like_eager(compiled(x, w), conv_relu(x, w))
                assert compiled(x, w).stride() == conv_relu(x, w).stride()
            stats.append(minicompile.stats())
    assert [s["frames"] for s in stats] == [1, 0, 1], stats
    assert stats[1]["kernels"] == stats[0]["kernels"] > stats[2]["kernels"], stats


# -- training -------------------------------------------------------------------------------


def test_residual_block_trains_channels_last(backend: str, capsys: pytest.CaptureFixture
                                             ) -> None:
    with forced():
        run_training(Residual(), backend, images((2, 4, 8, 8), (2, 4, 8, 8)))
    err = capsys.readouterr().err
    check_channels_last(err, convolutions=3)
    # The backward reads the forward's channels-last values and gives the 3x3 weights'
    # gradients back in their (eager) layout.
    backward = err[err.index("forward_backward after passes"):]
    assert "to_eager_layout" in backward


def test_channels_last_inputs_train(backend: str) -> None:
    """Channels-last images in: output and input gradient channels-last, as eager's."""
    with forced():
        run_training(Residual(), backend, images((2, 4, 8, 8), (2, 4, 8, 8),
                                                 channels_last=True))


def test_dropout_draws_eager_masks(backend: str, capsys: pytest.CaptureFixture) -> None:
    """Dropout fills its mask in memory order: it gets its input in eager's layout, so a
    seed gives eager's masks; the convolutions around it stay channels-last."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = ConvBnRelu(4, 8), ConvBnRelu(8, 8)
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.drop(self.a(x)))

    eager, twin = _fresh(Net(), True, backend)
    with forced():
        compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
        for seed in (1, 2):
            x = torch.randn(2, 4, 8, 8, device=device_for(backend))
            torch.manual_seed(seed)
            expected = eager(x)
            torch.manual_seed(seed)
            assert_like_eager(compiled(x), expected, rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    check_channels_last(err, convolutions=2, copies_back=1)
    graph = err[err.index("forward after passes"):]
    assert re.search(r"= to_eager_layout\(%\d+, \(512, 64, 8, 1\)\).*\n.*dropout", graph)


def test_dynamic_batch_compiles_twice(backend: str) -> None:
    with forced():
        run_training(ConvBnRelu(), backend, images((2, 4, 8, 8), (3, 4, 8, 8), (5, 4, 8, 8)))
    assert minicompile.stats()["graphs"] == 2


# -- a library model ------------------------------------------------------------------------


def _resnet18() -> nn.Module:
    from model_zoo import MODELS

    return next(c for c in MODELS if c.name == "torchvision_resnet18").build()


def test_resnet18_runs_channels_last(backend: str, capsys: pytest.CaptureFixture) -> None:
    with forced():
        run_inference(_resnet18(), backend, images((2, 3, 32, 32), (2, 3, 32, 32)))
    err = capsys.readouterr().err
    check_channels_last(err, convolutions=20)
    assert "20 batch norms folded into their convolutions" in err  # passes/fold_batch_norm.py
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_resnet18_trains_channels_last(backend: str, capsys: pytest.CaptureFixture) -> None:
    with forced():
        run_training(_resnet18(), backend, images((2, 3, 64, 64), (2, 3, 64, 64)))
    check_channels_last(capsys.readouterr().err, convolutions=20)
    assert minicompile.stats()["graphs"] == 1


class SqueezeExcite(nn.Module):
    """A depthwise convolution gated by a squeeze-excite block (MobileNetV3, EfficientNet):
    its two convolutions read one pixel an image (``groups`` of them: on the CPU one group
    makes them matrix products, passes/conv_gemm.py)."""

    def __init__(self, c: int = 16, groups: int = 1) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.reduce = nn.Conv2d(c, c // 4, 1, groups=groups)
        self.expand = nn.Conv2d(c // 4, c, 1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.dw(x))
        gate = self.expand(F.relu(self.reduce(y.mean((2, 3), keepdim=True))))
        return y * gate.sigmoid()


def test_one_pixel_convolutions_get_channels_last_strides(
        backend: str, capsys: pytest.CaptureFixture) -> None:
    """A one-pixel tensor is both layouts, but PyTorch reads a convolution's layout off the
    strides of every dim: the squeeze-excite's convolutions get their input and 1x1 weight
    as channels-last views (no copies), or oneDNN would run them in NCHW with reorders.
    "auto" chooses channels-last for this graph on the CPU (a depthwise convolution).
    (Grouped: one group would make them matrix products on the CPU, the test below.)"""
    with config.patch(onednn=False, logs=frozenset({"graph", "output_code"})):
        run_training(SqueezeExcite(groups=2), backend, images((2, 16, 8, 8), (2, 16, 8, 8)))
    err = capsys.readouterr().err
    if device_for(backend).type != "cpu":
        return  # (CUDA training graphs keep eager's layout under "auto")
    assert "oneDNN's depthwise convolutions are faster channels-last" in err
    views = re.findall(r"reinterpret\(\w+, \((\d+), (\d+), 1, 1\), \((\d+), 1, (\d+), (\d+)\)\)",
                       err)
    assert {(int(o), int(i)) for o, i, *_ in views} == {(4, 8), (16, 2)}, views
    assert all(int(a) == int(b) == int(c) for _, _, a, b, c in views), views
    assert not re.search(r"to_channels_last\(%\d+\) : f32\[\d+, \d+, 1, 1\]", err)


def test_one_pixel_convolutions_are_products_on_the_cpu(capsys: pytest.CaptureFixture) -> None:
    """On the CPU the squeeze-excite's convolutions (one group, one pixel an image) are
    ``F.linear`` of the pixels' rows, in a channels-last graph, with no copy of a one-pixel
    tensor: oneDNN's convolution took 33-60 us on two threads where the product took 6-15
    (its backward 90-140 against 11-41).  Values and gradients as eager's, two calls."""
    with config.patch(onednn=False, logs=frozenset({"graph", "output_code"})):
        run_training(SqueezeExcite(), "cpp", images((2, 16, 8, 8), (2, 16, 8, 8)))
    err = capsys.readouterr().err
    assert "oneDNN's depthwise convolutions are faster channels-last" in err
    assert "convolutions as products of pixel rows" in err
    assert len(re.findall(r"torch\.nn\.functional\.linear\(", err)) >= 2
    assert len(re.findall(r"torch\.nn\.functional\.conv2d\(", err)) >= 1  # the depthwise
    assert not re.search(r"to_(channels_last|eager_layout)\(%\d+(, \(.*\))?\) : f32\[2, \d+, 1, 1\]",
                         err)


# -- the decision ---------------------------------------------------------------------------


def test_auto_leaves_cpu_graphs_unchanged(capsys: pytest.CaptureFixture) -> None:
    """(Without oneDNN's packed convolutions, which want channels-last on the CPU.)"""
    with config.patch(layout_opt="auto", onednn=False, logs=frozenset({"fusion", "graph"})):
        run_inference(Residual(), "cpp", images((2, 4, 8, 8), (2, 4, 8, 8)))
    err = capsys.readouterr().err
    assert "eager layout: convolutions on CPU keep eager's layout" in err
    assert "to_channels_last" not in err and "to_eager_layout" not in err
    program = programs(err)[0]
    program.pop("return")
    assert not any(len(shape) == 4 and shape[1] > 1 and shape[2] * shape[3] > 1
                   and is_channels_last(shape, stride) for shape, stride, _ in program.values())


def test_auto_follows_the_device(backend: str, capsys: pytest.CaptureFixture) -> None:
    """"auto": channels-last for CUDA tensors (the Triton backend on a GPU), eager's layout
    for CPU ones (without oneDNN's packed convolutions)."""
    with config.patch(layout_opt="auto", onednn=False, logs=frozenset({"fusion", "graph"})):
        run_inference(Residual(), backend, images((2, 4, 8, 8), (2, 4, 8, 8)))
    err = capsys.readouterr().err
    if device_for(backend).type == "cuda":
        assert "channels-last convolutions: convolutions on CUDA run faster" in err
        check_channels_last(err, convolutions=3)
    else:
        assert "eager layout: convolutions on CPU keep eager's layout" in err


CONV = ops.extern_op(F.conv2d)


def conv_graph(device: str, cin: int, cout: int, groups: int = 1, grad: bool = False
               ) -> object:
    b = GraphBuilder(device)
    x = b.input("L_x", (2, cin, 16, 16), torch.bfloat16)
    w = b.input("L_w", (cout, cin // groups, 3, 3), torch.bfloat16)
    y = b(CONV, x, w, None, (1, 1), (1, 1), (1, 1), groups)
    graph = b.output(b("add", y, 1.0))
    if grad:
        for node in graph.nodes:
            if node.meta is not None:
                node.meta = type(node.meta)(**{**vars(node.meta), "requires_grad": True})
    return graph


@pytest.mark.parametrize(("graph", "mode", "expected"), [
    (lambda: conv_graph("cuda", 64, 128), "auto", True),
    (lambda: conv_graph("cpu", 64, 128), "auto", False),
    (lambda: conv_graph("cpu", 64, 128), "channels_last", True),
    (lambda: conv_graph("cuda", 64, 128), "off", False),
    # training graphs keep eager's layout under "auto" (passes/layout.py says why)
    (lambda: conv_graph("cuda", 64, 128, grad=True), "auto", False),
    (lambda: conv_graph("cuda", 64, 128, grad=True), "channels_last", True),
    # inference: grouped convolutions weighed by their FLOPs
    (lambda: conv_graph("cuda", 128, 128, groups=2), "auto", False),
    (lambda: conv_graph("cuda", 128, 128, groups=128), "auto", True),
    # the CPU: a mobile network's depthwise convolutions (layout.mobile), training too
    (lambda: conv_graph("cpu", 64, 64, groups=64, grad=True), "auto", True),
    (lambda: conv_graph("cpu", 64, 64, groups=64), "auto", True),
    (lambda: conv_graph("cpu", 64, 64, groups=64), "off", False),
    (lambda: conv_graph("cpu", 64, 64, groups=32, grad=True), "auto", False),
], ids=["cuda", "cpu", "forced", "off", "training", "training_forced", "grouped_inference",
        "depthwise_inference", "cpu_depthwise_training", "cpu_depthwise", "cpu_depthwise_off",
        "cpu_grouped_training"])
def test_decision(graph: object, mode: str, expected: bool) -> None:
    use, reason = decide(graph(), mode)  # type: ignore[operator]
    assert use == expected, reason


def test_packed_cpu_convolutions_decide_channels_last() -> None:
    """Convolutions that will run on packed oneDNN weights (passes/onednn_conv.py)."""
    assert decide(conv_graph("cpu", 64, 128), "auto", packed=True)[0]
    assert not decide(conv_graph("cpu", 64, 128), "off", packed=True)[0]


def test_the_pass_names_its_copies() -> None:
    graph, reason = optimize_layout(conv_graph("cpu", 4, 8), "channels_last")
    text = str(graph)
    assert reason == "channels-last convolutions: layout_opt is 'channels_last'"
    assert "to_channels_last(%0)" in text and "to_channels_last(%1)" in text
    assert "to_eager_layout(" in text
    graph.verify()


def test_layout_opt_from_the_environment() -> None:
    assert from_env({}).layout_opt == "auto"
    assert from_env({"MINICOMPILE_LAYOUT_OPT": "channels_last"}).layout_opt == "channels_last"
    with pytest.raises(ValueError, match="MINICOMPILE_LAYOUT_OPT"):
        from_env({"MINICOMPILE_LAYOUT_OPT": "nhwc"})
