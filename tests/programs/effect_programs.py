"""Cases with side effects: in-place ops on inputs and views of inputs, aliased inputs,
writes to objects, dicts, globals and pre-existing lists, and graph breaks (print,
``.item()``/``.tolist()`` feeding Python, branches on tensor values, untraceable calls).

The harness compares every input, object and global the case touches with eager's, and
the text printed, so each effect must happen exactly as in eager, exactly once.
"""

from __future__ import annotations

import functools

import os

import torch
import torch.nn.functional as F
from programs import Program, State, const, inputs, pos, program, randn

EFFECT_CASES: list[Program] = []
BREAK_CASES: list[Program] = []


def effect(sample, **options):
    return program(sample, EFFECT_CASES, **options)


def breaking(sample, **options):
    return program(sample, BREAK_CASES, **options)


# -- in-place ops on inputs -----------------------------------------------------------------


@effect(inputs(randn(4, 8)))
def add_inplace_returns_none(x):
    x.add_(1)


@effect(inputs(randn(4, 8)))
def setitem_row_zero(x):
    x[0] = 0
    return x * 2


@effect(inputs(randn(4, 8)))
def relu_inplace_returns_input(x):
    return x.relu_()


@effect(inputs(randn(4, 8)))
def mutate_view_of_input(x):
    y = x[1:]
    y.mul_(2)
    return y, x.sin()


@effect(inputs(randn(4, 8), randn(4, 8)))
def augmented_assignment_on_input(x, y):
    x += y
    x *= 2
    return x


@effect(inputs(randn(4, 8)))
def setitem_columns(x):
    x[:, 0] += 1
    x[..., -1] = x[..., 0] * 2
    return x * 1


@effect(inputs(randn(4, 8)))
def boolean_mask_setitem(x):
    x[x < 0] = 0.0
    return x + 1


@effect(inputs(randn(4, 8), randn(4, 8)))
def clamp_and_zero_inplace(x, y):
    x.clamp_(min=-0.5, max=0.5)
    y.zero_()
    return x + 1


@effect(inputs(randn(4, 8), randn(4, 8)))
def copy_and_fill_into_output(dst, src):
    dst.copy_(src * 2)
    dst[0].fill_(1.0)


@effect(inputs(randn(4, 8)))
def inplace_on_intermediate(x):
    y = x * 2
    y += 1
    y.sigmoid_()
    return y


@effect(inputs(randn(4, 8)))
def functional_relu_inplace(x):
    F.relu(x, inplace=True)
    return x * 2


@effect(inputs(randn(4, 8)))
def mutate_then_read(x):
    x.mul_(2)
    y = x + 1
    x.sub_(y)
    return y, x


@effect(inputs(randn(4, 8), randn(2, 8)))
def slice_assign_tensor(x, y):
    x[1:3] = y
    return x.exp()


@effect(inputs(randn(4, 8)))
def masked_fill_inplace(x):
    x.masked_fill_(x > 1, 1.0)
    return x


def _same_tensor_twice(device):
    x = torch.randn(4, 8, device=device)
    return (x, x), {}


@effect(_same_tensor_twice)
def aliased_inputs(a, b):
    a.add_(1)
    return b * 2


def _tensor_and_its_row(device):
    x = torch.randn(4, 8, device=device)
    return (x, x[0]), {}


@effect(_tensor_and_its_row)
def aliased_view_inputs(a, row):
    row.mul_(10)
    return a + 1


# -- writes to objects, dicts, lists and globals --------------------------------------------


class RunStats:
    def __init__(self) -> None:
        self.calls = 0
        self.last = None


def _stats_object(device):
    return (torch.randn(4, 8, device=device), RunStats()), {}


@effect(_stats_object)
def object_attribute_writes(x, stats):
    stats.calls += 1
    stats.last = x.detach() * 2
    return x.cos()


@effect(inputs(randn(4, 8), {"calls": 1}))
def dict_argument_writes(x, cache):
    cache["last"] = x * 2
    cache["calls"] = cache.get("calls", 0) + 1
    return cache["last"] + 1


@effect(inputs(randn(4, 8), [randn(2)]))
def append_to_argument_list(x, log):
    log.append(x.sin())
    log.append(len(log))
    return x.cos()


STEP = 0
ACTIVATIONS: list = []


def _reset_globals() -> None:
    global STEP
    STEP = 0
    ACTIVATIONS.clear()


GLOBALS = State(_reset_globals, lambda: (STEP, list(ACTIVATIONS)))


@effect(inputs(randn(4, 8)), state=GLOBALS)
def global_counter_write(x):
    global STEP
    STEP += 1
    return x * STEP


@effect(inputs(randn(4, 8)), state=GLOBALS)
def append_to_global_list(x):
    y = x.tanh()
    ACTIVATIONS.append(y.detach())
    ACTIVATIONS.append("tanh")
    return y * 2


# -- graph breaks that resume ---------------------------------------------------------------


@breaking(inputs(randn(4, 8)), graphs=2, breaks=1)
def print_in_the_middle(x):
    y = x * 2
    print("scaled", tuple(y.shape), y.dtype)
    return y + 1


@breaking(inputs(randn(4, 8)), graphs=2, breaks=1)
def functools_partial_across_a_break(x):
    act = functools.partial(F.leaky_relu, negative_slope=0.2)
    y = act(x)
    print("after the first activation")
    return act(y - 1)


@breaking(inputs(randn(4, 8)), graphs=3, breaks=2)
def two_prints(x):
    y = x.sin()
    print("after sin")
    z = y.cos()
    print("after cos")
    return z * y


@breaking(inputs(randn(8, 4), const([1] * 5 + [0] * 3, torch.bool)), graphs=2, breaks=1)
def item_feeds_slice(x, mask):
    y = x.exp()
    n = int(mask.sum().item())
    return y[:n] * 2 + n


@breaking(inputs(randn(3, 8), const([2, 5, 8], torch.int64)), graphs=2, breaks=1)
def tolist_lengths(x, lengths):
    x = x * 2
    out = []
    for i, n in enumerate(lengths.tolist()):
        out.append(x[i, :n].sum())
    return out


@breaking(inputs(randn(4, 8)), graphs=2, breaks=1)
def if_on_tensor_value(x):
    y = x.exp()
    if y.sum() > 0:  # always true: exp is positive
        return y - 1
    return y + 1


@breaking(inputs(pos(4, 8)), graphs=2, breaks=1)
def if_on_tensor_all(x):
    y = x.log()
    if (x > 0).all():
        y = y * 2
    return y.abs()


@breaking(inputs(randn(4, 8)), graphs=2, breaks=1)
def untraceable_call(x):
    y = x.sin()
    pid = os.getpid()
    return y * 2 + (pid > 0)


def _count_then_print(y, stats, buf):
    stats.calls += 1
    buf.add_(1)
    print("inside the helper")
    return y * 2


def _stats_object_and_buffer(device):
    return (torch.randn(4, 8, device=device), RunStats(), torch.zeros(3, device=device)), {}


@breaking(_stats_object_and_buffer, graphs=4, breaks=2)
def writes_then_break_in_a_helper(x, stats, buf):
    # The break is inside the helper: the caller's graph stops at the call, without the
    # helper's writes, which run once, when the helper runs as a frame of its own.
    return _count_then_print(x.sin(), stats, buf) + 1
