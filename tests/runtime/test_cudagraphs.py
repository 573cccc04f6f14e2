"""mode="reduce-overhead": compiled graphs recorded as CUDA graphs and replayed
(minicompile/runtime/cudagraphs.py).  Every test compares with eager on fresh values, call
after call: a replay that reads the first call's inputs is the bug these tests look for."""

from __future__ import annotations

import pytest
import torch

import minicompile
from minicompile.runtime import cudagraphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _reset():
    minicompile.reset()
    yield
    minicompile.reset()


def graphed(compiled):
    """The GraphedCall of a compiled function's (only) entry."""
    fn = compiled._compiled if isinstance(compiled, torch.nn.Module) else compiled
    (entry,) = fn.entries
    assert isinstance(entry.call, cudagraphs.GraphedCall), entry.call
    return entry.call


def test_parameters_and_buffers_are_static_inputs():
    sources = ["L['x']", "L['self']._modules['l']._parameters['weight']",
               "L['self']._buffers['mask']", "G['table']"]
    assert cudagraphs.static_positions(sources) == frozenset({1, 2})


def test_the_key_is_static_addresses_and_other_sizes():
    """A graph is recorded per key: the static inputs' addresses (a parameter moved by
    ``.data =`` records again), the other tensors' sizes and strides (not their memory,
    copied in), the other inputs' values."""
    call = cudagraphs.GraphedCall(lambda inputs: (), "f", frozenset({1, 2}))
    weight, bias = torch.randn(4, 3), torch.randn(4)
    key = call.key([torch.randn(2, 3), weight, bias, 5])
    assert call.key([torch.randn(2, 3), weight, bias, 5]) == key
    assert call.key([torch.randn(3, 2).t(), weight, bias, 5]) != key
    assert call.key([torch.randn(2, 4), weight, bias, 5]) != key
    assert call.key([torch.randn(2, 3), weight, bias, 6]) != key
    bias.data = torch.randn(4)
    moved = call.key([torch.randn(2, 3), weight, bias, 5])
    assert moved != key and moved[0][1] == bias.data_ptr()
    assert call.key([torch.randn(2, 3), weight, bias, 5]) == moved
    assert call.key([torch.randn(2, 4), weight, bias, 5])[0] == moved[0]
    weight.data = torch.randn(4, 3)  # (the last key's sizes differ from this call's)
    assert call.key([torch.randn(2, 3), weight, bias, 5])[0] == (weight.data_ptr(),
                                                                 bias.data_ptr())


def test_alone_sees_every_other_holder():
    keep = [torch.randn(10)]

    def alone() -> bool:  # outside assert: pytest's rewriting keeps references of its own
        found = cudagraphs.alone(keep[0])
        return found

    seen = [alone()]
    held = keep[0]
    seen.append(alone())
    del held
    view = keep[0][1:]
    seen.append(alone())
    del view
    storage = keep[0].untyped_storage()
    seen.append(alone())
    del storage
    w = torch.randn(10, requires_grad=True)
    loss = (w * keep[0]).sum()  # autograd saves keep[0]
    seen.append(alone())
    del loss
    seen.append(alone())
    assert seen == [True, False, False, False, False, True]


def test_cpu_tensors_run_the_ordinary_path():
    calls = []

    def call(inputs):
        calls.append(inputs)
        return (inputs[0] + 1,)

    g = cudagraphs.GraphedCall(call, "f", frozenset())
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(g([x])[0], x + 1)
    assert len(calls) == 3 and not g.recorded
    assert g.off is not None


def test_reduce_overhead_on_cpu_compiles_as_usual():
    @minicompile.compile(mode="reduce-overhead")
    def f(x, y):
        return torch.sin(x) * y + 1

    for _ in range(3):
        x, y = torch.randn(5, 7), torch.randn(7)
        torch.testing.assert_close(f(x, y), torch.sin(x) * y + 1)
    assert minicompile.stats()["eager_fallbacks"] == 0


@cuda
def test_replays_see_new_values():
    @minicompile.compile(mode="reduce-overhead")
    def f(x, y):
        return (torch.sin(x) * y).sum(-1), torch.relu(x) + y

    for _ in range(5):
        x, y = torch.randn(64, 128, device="cuda"), torch.randn(128, device="cuda")
        out = f(x, y)
        torch.testing.assert_close(out[0], (torch.sin(x) * y).sum(-1))
        torch.testing.assert_close(out[1], torch.relu(x) + y)
    assert len(graphed(f).recorded) == 1


@cuda
def test_inputs_in_the_recorded_memory_are_not_copied():
    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        return torch.sigmoid(x) * 3

    x = torch.randn(256, device="cuda")
    for _ in range(5):
        x.copy_(torch.randn(256, device="cuda"))  # the same tensor, new values
        torch.testing.assert_close(f(x), torch.sigmoid(x) * 3)
    (graph,) = graphed(f).recorded.values()
    assert not graph.owned and graph.buffers[0] is x


@cuda
def test_a_dropped_batch_is_overwritten_a_held_one_never():
    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        return x.exp() - 1

    for _ in range(4):  # each batch dropped before the next call
        x = torch.randn(64, device="cuda")
        torch.testing.assert_close(f(x), x.exp() - 1)
        del x
    (graph,) = graphed(f).recorded.values()
    assert not graph.owned  # later batches were copied into the recorded one

    @minicompile.compile(mode="reduce-overhead")
    def g(x):
        return x.exp() - 1

    held = [torch.randn(64, device="cuda") for _ in range(5)]  # the caller keeps them all
    copies = [h.clone() for h in held]
    for h in held:  # warm-up on held[0], recorded on held[1], then held[2]...
        torch.testing.assert_close(g(h), h.exp() - 1)
    for h, c in zip(held, copies):
        torch.testing.assert_close(h, c)  # nothing was written into a held input
    (graph,) = graphed(g).recorded.values()
    assert graph.owned  # recorded again on a buffer of its own


@cuda
def test_module_parameters_are_read_in_place():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64)).cuda().eval()
    compiled = minicompile.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 32, device="cuda")
            torch.testing.assert_close(compiled(x), model(x))
            for p in model.parameters():  # an optimizer's in-place update
                p.add_(torch.randn_like(p) * 0.1)
    g = graphed(compiled)
    (recorded,) = g.recorded.values()
    assert len(recorded.copied) == 1  # x alone; parameters are used where they are


@cuda
def test_mutated_inputs_are_written_back():
    @minicompile.compile(mode="reduce-overhead")
    def f(x, acc):
        acc.add_(x)
        x.mul_(2)
        return acc.sum()

    for _ in range(4):
        x, acc = torch.randn(16, device="cuda"), torch.randn(16, device="cuda")
        x0, acc0 = x.clone(), acc.clone()
        total = f(x, acc)
        torch.testing.assert_close(acc, acc0 + x0)
        torch.testing.assert_close(x, x0 * 2)
        torch.testing.assert_close(total, (acc0 + x0).sum())


@cuda
def test_outputs_stay_valid_until_the_next_call():
    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        return x.cos() + 1

    for _ in range(2):  # warm-up, then record
        f(torch.randn(32, device="cuda"))
    a, b = torch.randn(32, device="cuda"), torch.randn(32, device="cuda")
    out_a = f(a)
    kept = out_a.clone()
    view = out_a[3:]
    torch.testing.assert_close(out_a, a.cos() + 1)
    out_b = f(b)
    torch.testing.assert_close(out_b, b.cos() + 1)
    torch.testing.assert_close(kept, a.cos() + 1)
    with pytest.raises(RuntimeError, match="clone"):
        out_a.sum()
    with pytest.raises(RuntimeError, match="clone"):
        view.sum()
    torch.testing.assert_close(out_b, b.cos() + 1)  # the newest output is intact


@cuda
def test_an_output_that_views_an_input_views_the_callers_tensor():
    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        return x.t(), x * 3

    for _ in range(3):
        x = torch.randn(4, 6, device="cuda")
        t, y = f(x)
        assert t.data_ptr() == x.data_ptr() and t.shape == (6, 4)
        torch.testing.assert_close(y, x * 3)


@cuda
def test_non_contiguous_inputs():
    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        return torch.softmax(x, -1)

    for _ in range(4):
        x = torch.randn(48, 40, device="cuda").t()
        torch.testing.assert_close(f(x), torch.softmax(x, -1))


@cuda
def test_one_graph_per_size_then_the_ordinary_path():
    @minicompile.compile(mode="reduce-overhead", dynamic=True)
    def f(x):
        return torch.tanh(x) * 2

    sizes = list(range(2, 2 + cudagraphs.LIMIT + 2))
    for _ in range(2):
        for n in sizes:
            for _ in range(2):
                x = torch.randn(n, 8, device="cuda")
                torch.testing.assert_close(f(x), torch.tanh(x) * 2)
    g = graphed(f)
    assert len(g.recorded) == cudagraphs.LIMIT
    assert minicompile.stats()["recompiles"] == 0


@cuda
def test_graph_break_segments_are_each_recorded():
    seen = []

    @minicompile.compile(mode="reduce-overhead")
    def f(x):
        y = x.exp()
        seen.append(float(y.sum()))  # a graph break
        return y * 2 + 1

    for _ in range(4):
        x = torch.randn(8, device="cuda")
        torch.testing.assert_close(f(x), x.exp() * 2 + 1)
        assert seen[-1] == pytest.approx(float(x.exp().sum()), rel=1e-5)


@cuda
def test_training_graphs_run_without_cuda_graphs():
    model = torch.nn.Linear(8, 4).cuda()
    compiled = minicompile.compile(model, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(5, 8, device="cuda")
        compiled(x).square().sum().backward()
        grad = model.weight.grad.clone()
        model.weight.grad = None
        model(x).square().sum().backward()
        torch.testing.assert_close(grad, model.weight.grad)
        model.weight.grad = None


@cuda
def test_a_static_address_is_read_in_place_and_a_new_one_records_again():
    """transformers' static KV cache: marked with torch._dynamo.mark_static_address,
    written in place at one position each step with its length counted up, and a new one
    for each ``generate`` call.  Each cache is read and written where it is (no copy in or
    back), every update happens once (the recording's warm-up run is undone), and a new
    cache records again."""

    @minicompile.compile(mode="reduce-overhead")
    def step(x, pos, cache, length):
        cache.index_copy_(0, pos, x)
        length.add_(1)
        return cache.sum(0) * 2

    for _ in range(2):
        cache, length = torch.zeros(8, 32, device="cuda"), torch.zeros((), device="cuda")
        torch._dynamo.mark_static_address(cache)
        torch._dynamo.mark_static_address(length)
        want = torch.zeros(8, 32, device="cuda")
        for i in range(5):
            x, pos = torch.randn(1, 32, device="cuda"), torch.tensor([i], device="cuda")
            want[i] = x[0]
            torch.testing.assert_close(step(x, pos, cache, length), want.sum(0) * 2)
            torch.testing.assert_close(cache, want)
            assert length.item() == i + 1
        (graph,) = graphed(step).recorded.values()
        assert {id(graph.buffers[k]) for k in graph.pinned} == {id(cache), id(length)}


@cuda
def test_an_updated_input_read_over_replays_is_state_and_a_new_one_records_again():
    """A KV cache made inside a compiled prefill is not marked static (transformers marks
    only caches it allocates eagerly): updated in place and read in place over replays, it
    is state, and the next cache records again on itself, never copied in and back each
    step.  A tensor handed in new at every call keeps the copies (no recording per call)."""

    @minicompile.compile(mode="reduce-overhead")
    def step(x, pos, cache):
        cache.index_copy_(0, pos, x)
        return cache.sum(0) * 2

    def six_steps(cache: torch.Tensor, want: torch.Tensor) -> None:
        for i in range(6):
            x, pos = torch.randn(1, 32, device="cuda"), torch.tensor([i], device="cuda")
            want[i] = x[0]
            torch.testing.assert_close(step(x, pos, cache), want.sum(0) * 2)
            torch.testing.assert_close(cache, want)

    for _ in range(3):
        cache, want = torch.zeros(8, 32, device="cuda"), torch.zeros(8, 32, device="cuda")
        six_steps(cache, want)
        (graph,) = graphed(step).recorded.values()
        assert not graph.owned and any(b is cache for b in graph.buffers)

    # A recording call's tensor the caller still holds at the next call (transformers keeps
    # some between ``generate`` calls) records again: on buffers of its own for the other
    # inputs, the cache still read in place and never copied back.
    (first,) = graphed(step).recorded.values()
    at = {k: first.buffers[k] for k in first.copied}
    (kc,) = [k for k, b in at.items() if b is cache]
    (kx,) = [k for k, b in at.items() if b is not cache and b.is_floating_point()]
    held = at[kx]
    six_steps(cache, want)
    (graph,) = graphed(step).recorded.values()
    assert graph is not first and graph.buffers[kc] is cache, (graph.own, graph.copied)
    assert graph.own == set(at) - {kc} and held.shape == (1, 32)
    assert graph.in_place >= 5, graph.in_place  # no step copied the cache back

    @minicompile.compile(mode="reduce-overhead")
    def bump(x, acc):
        acc.add_(x)
        return acc * 2

    recordings, counts = set(), []
    for _ in range(8):
        x, acc = torch.randn(16, device="cuda"), torch.randn(16, device="cuda")
        want = acc + x
        torch.testing.assert_close(bump(x, acc), want * 2)
        torch.testing.assert_close(acc, want)
        recordings |= {id(g) for g in graphed(bump).recorded.values()}
        counts.append(len(recordings))
    # Copied in and back, not recorded per call: the first recording is made on the
    # caller's tensors, at most one more on buffers of the graph's own (an H200 shows 2).
    assert counts[3] == counts[-1] <= 2, counts


def test_a_write_back_is_copied_at_the_end_of_the_call(backend: str, device: torch.device,
                                                       capsys: pytest.CaptureFixture) -> None:
    """A 0-d length counted up beside a reduction that reads its old value (a static cache's
    ``cumulative_length``, which no kernel may store in place: another program of the
    reduction may still read it): under mode="reduce-overhead" ``call`` copies the new value
    into it after its last kernel (a copy the CUDA graph replays), rebuild none.  A view the
    caller holds sees each update, the output is a tensor of its own, and a new length (the
    next ``generate`` call's cache) is updated, not the old one."""
    from minicompile import config

    def step(x, length):
        pos = torch.arange(x.shape[1], device=x.device) + length
        length.add_(1)
        return (x * pos).sum(-1) + length

    compiled = minicompile.compile(step, backend=backend, mode="reduce-overhead")
    with config.patch(logs=frozenset({"output_code"})):
        for _ in range(2):  # a second length: another cache
            length, mirror = torch.tensor(3, device=device), torch.tensor(3, device=device)
            view = length.view(1)
            for _ in range(4):
                x = torch.randn(2, 5, device=device)
                got, want = compiled(x, length), step(x, mirror)
                torch.testing.assert_close(got, want)
                assert length.item() == mirror.item() and view.item() == mirror.item()
                assert got.untyped_storage().data_ptr() != length.untyped_storage().data_ptr()
    err = capsys.readouterr().err
    assert err.count("# rebuild's write-back, in the call") == 1, err
    assert minicompile.stats()["graphs"] == 1
