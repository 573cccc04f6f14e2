"""In-place tensor ops (functionalized, written back) and Python side effects (replayed):
after a replayed call, every object must be exactly as eager left it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import assert_same, body, capture, replay

from minicompile.errors import Unsupported


def state(value):
    if isinstance(value, (list, tuple)):
        return [state(v) for v in value]
    if isinstance(value, dict):
        return {k: state(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, torch.Tensor):
        return state(vars(value))
    return value


def check_exact(fn, *args):
    """Replay on copies of ``args`` and compare return value and arguments with eager."""
    ours, eager = copy.deepcopy(args), copy.deepcopy(args)
    cap, frame = capture(fn, *ours)
    assert cap.guards.check(*frame), cap.guards.explain_failure(*frame)
    got = replay(cap, frame)
    expected = fn(*eager)
    assert_same(got, expected)
    assert_same(state(ours), state(eager))
    return cap, ours, got


def rand(*shape):
    return torch.randn(*shape)


def test_inplace_methods_on_inputs_are_written_back() -> None:
    def f(x, y):
        x.add_(1)
        y.mul_(2).clamp_(-1, 1)
        x.sub_(y, alpha=2)
        return x.exp()

    cap, (x, y), _ = check_exact(f, rand(4, 8), rand(4, 8))
    # (one call for both: runtime/values.write_backs)
    assert "write_backs((L_x, L_y, ), (" in cap.rebuild_source, cap.rebuild_source
    assert "add_" not in body(cap)  # functional ops only


def test_returning_the_mutated_input_returns_the_callers_tensor() -> None:
    def f(x):
        return x.add_(1)

    cap, (x,), got = check_exact(f, rand(3))
    assert got is x


def test_fill_zero_copy_operators_and_out() -> None:
    def f(x, y, z, w):
        x.zero_()
        y.fill_(2.5)
        z.copy_(w[0])
        w += 1
        w *= torch.tensor(2.0)
        torch.mul(w, 3, out=z)
        F.relu(y, inplace=True)
        return None

    check_exact(f, rand(3, 4), rand(3, 4), rand(2, 4), rand(2, 4))


def test_views_of_inputs_mutate_the_base() -> None:
    def f(x):
        x[0].zero_()
        x[1:, 2].mul_(2)
        x.view(-1)[:3] = 7.0
        x.t()[0, 1] = -1.0
        row = x[2]
        x.add_(1)  # the earlier view sees it
        return row * 1

    check_exact(f, rand(4, 5))


def test_expanded_views_without_shared_elements_are_written() -> None:
    # Eager writes an expanded view whose elements share no memory (empty, or expanded to
    # size 1 only); found by tests/random/search_programs.py (it was a graph break).
    def empty(x):
        return x.unsqueeze(0).expand(2, *x.shape).mul_(2)

    def to_size_one(x):
        v = x.unsqueeze(0).expand(1, *x.shape)
        v.add_(1)
        return v * 2

    check_exact(empty, rand(0, 3))
    check_exact(to_size_one, rand(2, 3))
    check_exact(to_size_one, rand(3, 2).t())


def test_expanded_views_with_shared_elements_are_refused() -> None:
    def shared(x):
        return x.unsqueeze(0).expand(2, *x.shape).mul_(2)  # eager raises

    with pytest.raises(Unsupported, match="expanded"):
        capture(shared, rand(2, 3))


def test_setitem_forms() -> None:
    def f(x, idx, v):
        x[0] = v
        x[..., 1] = 3
        x[None, 2:3] = v[:1]
        x[idx] = 0.5
        return x.sum(0)

    check_exact(f, rand(4, 3), torch.tensor([1, 3]), rand(3))


def test_intermediate_mutation_rebinds_only() -> None:
    def f(x):
        y = x * 2
        z = y
        y.add_(1)
        return z, x

    cap, (x,), (z, xr) = check_exact(f, rand(3))
    assert xr is x and "copy_" not in cap.rebuild_source


def test_tuple_results_and_views_of_split() -> None:
    def f(x):
        a, b = x.chunk(2, dim=1)
        a.mul_(10)
        v, i = x.max(dim=1)
        return v, i, b + 0

    check_exact(f, rand(3, 4))


class Box:
    def __init__(self):
        self.count = 0
        self.items = []


G_COUNTER = 0


def effects(x, box, lst, d):
    global G_COUNTER
    box.count += 1
    G_COUNTER = G_COUNTER + 1
    lst.append(x * 2)
    d["k"] = box.count
    del d["a"]
    box.items.extend([G_COUNTER, box.count])
    return lst[-1] + box.count, lst


def test_python_side_effects_are_replayed() -> None:
    global G_COUNTER
    box, lst, d = Box(), [1], {"a": 1}
    cap, frame = capture(effects, rand(2), box, lst, d)
    assert (box.count, lst, d, G_COUNTER) == (0, [1], {"a": 1}, 0)  # tracing changed nothing
    (out, returned) = replay(cap, frame)
    assert returned is lst and len(lst) == 2 and d == {"k": 1}
    assert box.count == 1 and box.items == [1, 1] and G_COUNTER == 1
    torch.testing.assert_close(out, lst[1] + 1)
    # the guards saw the old values: a second call recompiles
    assert not cap.guards.check(*frame)
    assert "value: expected 0, got 1" in cap.guards.explain_failure(*frame)
    G_COUNTER = 0


def test_nonlocal_cell_writes_are_replayed() -> None:
    total = 0

    def f(x):
        nonlocal total
        total = total + 1
        return x * total

    cap, frame = capture(f, rand(2))
    replay(cap, frame)
    assert total == 1


def test_aliased_inputs_are_guarded() -> None:
    def f(a, b):
        a.add_(1)
        return b * 1

    x = rand(3)
    cap, frame = capture(f, x, x)
    assert len(cap.graph.placeholders) == 1
    assert "L_b is L_a" in str(cap.guards)
    assert not cap.guards.check(rand(3), rand(3))
    y, z = rand(3), rand(3)
    cap2, frame2 = capture(f, y, z)
    assert not cap2.guards.check(x, x)
    assert "distinct storages" in cap2.guards.explain_failure(x, x[:])
    # b shares a's storage: traced as a view of a (one placeholder), guarded as one.
    cap3, frame3 = capture(f, x, x[:])
    assert len(cap3.graph.placeholders) == 1 and "a view of L['a']" in str(cap3.guards)
    assert cap3.guards.check(y, y[:]) and not cap3.guards.check(y, z)
    # Views that overlap without one starting the storage: refused, as before.
    with pytest.raises(Unsupported, match="shares memory"):
        capture(f, x[1:], x[:2])


def test_mutation_under_autograd_is_refused() -> None:
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(Unsupported, match="in-place op on an input that requires grad"):
        capture(lambda w: w.add_(1), w)
    with torch.no_grad():
        check_exact(lambda w: w.add_(1), w.detach().clone().requires_grad_())


def test_an_inplace_flag_passed_by_position_mutates_as_eager() -> None:
    # nn.ReLU6 calls F.hardtanh(input, min_val, max_val, self.inplace): the flag by position.
    def f(x):
        y = x * 2
        before = y + 1  # read before the in-place call
        a = F.hardtanh(y, -1.0, 1.0, True)
        F.leaky_relu(before, 0.2, True)
        F.elu(before, 1.0, True)
        return a, y, before, a is y

    cap, _, got = check_exact(f, rand(12))
    assert got[3] is True
    assert ", True)" not in body(cap) and "inplace=True" not in body(cap)


def test_inplace_activation_modules_train_compiled(backend: str, device: torch.device) -> None:
    import minicompile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU6(inplace=True), torch.nn.Conv2d(4, 4, 1),
                                torch.nn.Hardswish(inplace=True)).to(device).train()
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin, backend=backend)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8, device=device)
        model(x).square().sum().backward()
        compiled(x).square().sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    assert minicompile.stats()["eager_fallbacks"] == 0


def cache_step(cache, at, k):
    """A KV cache's update: read the old cache, write a row with index_copy_ (or
    index_put_: ``cache[at] = k``), then read the new cache."""
    before = cache.sum(0)
    cache.index_copy_(0, at, k)
    return torch.softmax(cache, -1) + before


def index_put_step(cache, at, k):
    before = cache.sum(0)
    cache[at] = k * 2
    return torch.softmax(cache, -1) + before


def cache_step_reading_the_old_value_later(cache, at, k):
    old = cache * 1  # nothing orders it before the update: it may run after
    cache.index_copy_(0, at, k)
    return old + cache


@pytest.mark.parametrize("fn", [cache_step, index_put_step,
                                cache_step_reading_the_old_value_later])
def test_library_updates_of_inputs_match_eager(fn, backend: str, device: torch.device) -> None:
    """Library calls that update an input run in place on it (passes/inplace.py) where
    every read of the old value comes before; values and the caller's tensor are eager's."""
    import minicompile

    compiled = minicompile.compile(fn, backend=backend)
    for step in range(2):
        cache = torch.randn(8, 4, device=device)
        at = torch.tensor([step + 2], device=device)
        k = torch.randn(1, 4, device=device)
        mine = cache.clone()
        torch.testing.assert_close(compiled(mine, at, k), fn(cache, at, k))
        torch.testing.assert_close(mine, cache)
    stats = minicompile.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_fallbacks"] == 0, stats
