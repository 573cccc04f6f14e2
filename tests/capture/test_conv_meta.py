"""The 2-d convolution's metadata rule (minicompile/meta_rules.py) gives what eager gives."""

from __future__ import annotations

import random

import torch

from minicompile import meta_rules, ops

from meta_check import rule_and_eager

CPU = torch.device("cpu")


def _tensor(rng: random.Random, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``shape``: contiguous, channels-last, or a non-dense view."""
    kind = rng.random()
    if kind < 0.35:
        return torch.randn(shape, dtype=dtype).to(memory_format=torch.channels_last)
    if kind < 0.5:  # a strided view: every other element of a wider tensor
        return torch.randn([*shape[:-1], 2 * shape[-1]], dtype=dtype)[..., ::2]
    if kind < 0.6:  # dims 2 and 3 swapped in memory
        return torch.randn([*shape[:2], shape[3], shape[2]], dtype=dtype).transpose(2, 3)
    return torch.randn(shape, dtype=dtype)


def _args(rng: random.Random) -> tuple[tuple, dict]:
    """Mostly valid convolutions (1x1 and 3x3, strides, padding, dilation, groups, channels
    and sizes of 1), sometimes not (a channel mismatch, a kernel larger than the input,
    another dtype, a string padding, a 3-d input)."""
    dtype = rng.choice([torch.float32, torch.float64, torch.bfloat16])
    groups = rng.choice([1, 1, 1, 2])
    c_in = groups * rng.choice([1, 2, 3])
    c_out = groups * rng.choice([1, 2, 4])
    k = rng.choice([1, 1, 3])
    h, w = rng.choice([1, 2, 5, 7]), rng.choice([1, 3, 6])
    x = _tensor(rng, [rng.choice([1, 2]), c_in, h, w], dtype)
    if rng.random() < 0.05:
        x = x[0]  # unbatched
    w_in = c_in // groups + (1 if rng.random() < 0.05 else 0)
    weight = _tensor(rng, [c_out, w_in, k, rng.choice([k, 1])],
                     rng.choice([dtype, torch.float32]) if rng.random() < 0.1 else dtype)
    bias = torch.randn(c_out, dtype=dtype) if rng.random() < 0.5 else None
    options = {}
    if rng.random() < 0.5:
        options["stride"] = rng.choice([1, 2, (2, 1), [1, 2]])
    if rng.random() < 0.5:
        options["padding"] = rng.choice([0, 1, (1, 0), "same", "valid"])
    if rng.random() < 0.3:
        options["dilation"] = rng.choice([1, 2, (1, 2)])
    if groups > 1 or rng.random() < 0.2:
        options["groups"] = groups
    if options.get("padding") == "same" and options.get("stride", 1) != 1:
        options["padding"] = 0
    if rng.random() < 0.5:
        return (x, weight, bias), options
    return (x, weight), {"bias": bias, **options}


def test_conv2d_rule_matches_eager() -> None:
    """Where the rule answers, infer_meta's general path (PyTorch's meta function, then
    library_layouts.conv_layout) gives the same metadata, and eager (CPU, real tensors) the
    same shape, dtype and strides; where eager raises, the rule does not answer."""
    conv = torch.nn.functional.conv2d  # (torch.conv2d itself, reached by either name)
    name = ops.extern_op(conv)  # registered as capture registers it
    assert meta_rules.LIBRARY[name] is meta_rules.LIBRARY["torch.conv2d"]
    rng = random.Random(0)
    answered = 0
    for _ in range(300):
        args, kwargs = _args(rng)
        fast, eager, metas, meta_kwargs = rule_and_eager(meta_rules.LIBRARY[name], args,
                                                         kwargs, conv)
        if fast is None:
            continue
        answered += 1
        # Strides of dims of size 1 are never stepped along; there eager's CPU kernels and
        # PyTorch's meta function (the general path) disagree, and the rule is the latter.
        strides = [(int(a), b) for a, b, n in zip(fast.stride, eager.stride(), eager.shape)
                   if n > 1]
        assert tuple(map(int, fast.shape)) == tuple(eager.shape), (args, kwargs)
        assert fast.dtype == eager.dtype and all(a == b for a, b in strides), (args, kwargs)
        rule = meta_rules.LIBRARY.pop(name)
        try:  # the general path (PyTorch's meta function, then library_layouts.conv_layout)
            slow = ops._infer_meta(name, metas, meta_kwargs, CPU)
        finally:
            meta_rules.LIBRARY[name] = rule
        assert slow == fast, (args, kwargs)
    assert answered > 150
