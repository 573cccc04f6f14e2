"""``mode="reduce-overhead"``: a compiled graph recorded as a CUDA graph and replayed.

:class:`GraphedCall` wraps a generated ``call(inputs)``.  Parameters, buffers and inputs
marked with ``mark_static_address`` are read in place (a new static one records again);
other inputs are copied into the recorded memory, or the graph records again on its own
buffers.  A key's first call runs the ordinary path, its second records, at most ``LIMIT``
graphs.  Outputs live in the graph's pool until its next replay, which invalidates those
still alive; inputs a kernel stores into are copied back; an output that is a whole input (a
library call stored into it in place) is handed out as the caller's tensor itself.  An
updated input read in place over several replays is state (a KV cache): a new one records
again, in place, and a graph recorded again on buffers of its own keeps reading it in
place.  What cannot be recorded runs the ordinary path, with the reason logged once.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat, trace
from minicompile.runtime.values import picker

LIMIT = 8  # recorded graphs per compiled graph (one per set of sizes)
STATE = 2  # replays on the recorded tensors after which an updated input is state (a KV cache)
STALE = ("minicompile: this tensor is an output of a CUDA graph (mode='reduce-overhead') that a "
         "later call of the same compiled function has overwritten; clone() an output to keep it "
         "past the next call")

_invalidate, _storage_at, _storage_use_count = compat.storage_functions()


def alone(t: torch.Tensor, ours: int = 1) -> bool:
    """Whether only ``ours`` Python references hold ``t`` (or its storage; no C++ one either)."""
    storage = t.untyped_storage()
    return (sys.getrefcount(t) == ours + 2 and t._use_count() == 1  # + t and the argument
            and sys.getrefcount(storage) == 3 and _storage_use_count is not None
            and _storage_use_count(storage._cdata) <= 2)


def static_positions(sources: list[str]) -> frozenset[int]:
    """Inputs whose memory stays put between calls: a module's parameters and buffers."""
    return frozenset(i for i, s in enumerate(sources)
                     if "._parameters[" in s or "._buffers[" in s)


_data_ptr, _stride = torch.Tensor.data_ptr, torch.Tensor.stride
_shape = operator.attrgetter("shape")


def why_not(inputs: list) -> str | None:
    """Why a call with these inputs cannot be recorded (None: it can)."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if _invalidate is None or _storage_at is None:
        return f"PyTorch {torch.__version__} cannot hand out outputs of a CUDA graph safely"
    for k, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.device.type != "cuda":
            return f"input {k} is a {x.device.type} tensor"
    return None


@dataclasses.dataclass
class _Output:
    """How a recorded output is handed out at each replay."""

    tensor: torch.Tensor  # the graph's own (pool memory, or a view of an input buffer)
    input: int | None  # the input whose memory it views, or None: pool memory
    offset: int  # storage offset relative to that input's
    whole: bool = False  # the input itself (a library call stored into it in place)


class Recorded:
    """One CUDA graph: its input buffers, its outputs, and what the last replay handed out."""

    def __init__(self, call: Callable[[list], tuple], inputs: list, static: frozenset[int],
                 mutated: frozenset[int], own: frozenset[int] = frozenset(),
                 state: frozenset[int] = frozenset()) -> None:
        self.copied = [k for k, x in enumerate(inputs)
                       if isinstance(x, torch.Tensor) and k not in static]
        self.mutated = [k for k in self.copied if k in mutated]
        self.pinned = [k for k in self.copied if compat.static_address(inputs[k])]
        self.own = own  # inputs on buffers of its own (the others: the recording call's)
        self.state = state  # inputs known to be state: read in place, a new one records
        self.in_place = 0  # replays that updated the recorded tensors themselves
        self.handed: list[Any] = []  # weak references to the storages handed out last
        self.buffers = list(inputs)
        for k in self.copied:
            if k not in own or k in self.pinned:  # pinned ones are read in place
                continue
            x = inputs[k]
            self.buffers[k] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                                  device=x.device).copy_(x)
        self.pointers = [b.data_ptr() if isinstance(b, torch.Tensor) else 0
                         for b in self.buffers]
        # The warm-up run's random draws (dropout, torch.rand) are not the call's: the
        # generator is set back, so the replay below draws what eager draws from it.
        device = next((b.device for b in self.buffers if isinstance(b, torch.Tensor)
                       and b.is_cuda), torch.device("cuda", torch.cuda.current_device()))
        rng = torch.cuda.get_rng_state(device)
        # What the warm-up run stores into the caller's own tensors is put back: the call's
        # update (a cache's length += 1) happens once, at the replay that follows.
        kept = [(self.buffers[k], self.buffers[k].clone()) for k in self.mutated
                if self.buffers[k] is inputs[k]]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the warm-up run on the graph's own buffers
            call(list(self.buffers))
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for buf, before in kept:
            buf.copy_(before)
        torch.cuda.set_rng_state(rng, device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=torch.cuda.graph_pool_handle()):
            outs = call(list(self.buffers))
        self.outputs = [self._describe(o) for o in outs]
        self._plan_replay()

    def _plan_replay(self) -> None:
        """What each replay does, as lists (no per-call walks of the inputs and outputs):
        the pinned inputs' addresses to check, the inputs to copy in and the updated ones to
        copy back (a pinned input is where it was recorded: nothing to copy), and outputs
        by how they are handed out."""
        pinned = set(self.pinned)
        self.pick_copied = picker(self.copied)
        self.pinned_at = tuple(self.pointers[k] for k in self.pinned)
        self.copy_in = [k for k in self.copied if k not in pinned]
        self.copy_out = [k for k in self.mutated if k not in pinned]
        self.settled = frozenset(k for k in self.copy_out if k not in self.own)
        self.template = [None if isinstance(o, _Output) else o for o in self.outputs]
        self.wholes = [(i, o.input) for i, o in enumerate(self.outputs)
                       if isinstance(o, _Output) and o.whole]
        self.others = [(i, o) for i, o in enumerate(self.outputs)
                       if isinstance(o, _Output) and not o.whole]

    def __del__(self) -> None:  # the pool goes: no handed-out output may read it
        try:
            self._invalidate_handed()
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be half gone
            pass

    def _describe(self, out: Any) -> _Output | Any:
        if not isinstance(out, torch.Tensor):
            return out
        ptr = out.untyped_storage().data_ptr()
        for k, buf in enumerate(self.buffers):
            if isinstance(buf, torch.Tensor) and buf.untyped_storage().data_ptr() == ptr:
                whole = out is buf or (out.shape == buf.shape and out.stride() == buf.stride()
                                       and out.storage_offset() == buf.storage_offset()
                                       and out.dtype == buf.dtype)
                return _Output(out, k, out.storage_offset() - buf.storage_offset(), whole)
        return _Output(out, None, out.storage_offset())

    @property
    def owned(self) -> bool:
        """Whether some input is read from a buffer of the graph's own."""
        return bool(self.own)

    def addresses(self, inputs: list) -> dict[int, int]:
        """The copied inputs' addresses, by position: read once a call, for every use."""
        return dict(zip(self.copied, map(_data_ptr, self.pick_copied(inputs))))

    def moved_pinned(self, now: dict[int, int]) -> bool:
        """Whether an input marked as a static address is another tensor than recorded
        (``now``: :meth:`addresses`)."""
        return tuple(map(now.__getitem__, self.pinned)) != self.pinned_at

    def moved_state(self, now: dict[int, int]) -> bool:
        """Whether an input the graph updates in place, and read in place over ``STATE``
        replays, is another tensor now: state such as the next ``generate`` call's KV
        cache, which the graph records again on, rather than copy it in and back at every
        replay (a function handed a new tensor to update at each call gets copies)."""
        pointers = self.pointers
        return any(now[k] != pointers[k] for k in self.learned_state())

    def to_own(self, now: dict[int, int]) -> frozenset[int]:
        """The inputs a graph recorded again on these gets buffers of its own for: all but
        the updated ones that are still the tensors recorded here (read in place)."""
        mutated = set(self.mutated)
        return frozenset(k for k in self.copied if k not in mutated or now[k] != self.pointers[k])

    def learned_state(self) -> frozenset[int]:
        """The inputs known to be state: read in place over ``STATE`` replays here, or in
        an earlier graph of the same call."""
        return self.settled if self.in_place >= STATE else self.state

    def replay(self, inputs: list, now: dict[int, int]) -> tuple | None:
        """Run the graph on ``inputs`` (``now``: their :meth:`addresses`); None when it
        cannot (then record again)."""
        if self.moved_pinned(now) or self.moved_state(now):
            return None
        buffers, pointers, own = self.buffers, self.pointers, self.own
        for k in self.copy_in:
            if now[k] == pointers[k]:  # the recorded tensor itself: nothing to copy
                continue
            buf = buffers[k]  # the recording call's tensor may have been moved (set_(),
            if k not in own and (buf.data_ptr() != pointers[k]  # resize_()) or be held
                                 or not alone(buf, ours=2)):  # (the list, the local)
                return None
            buf.copy_(inputs[k])
        self._invalidate_handed()
        self.graph.replay()
        moved = [k for k in self.copy_out if now[k] != pointers[k]]
        for k in moved:
            inputs[k].copy_(buffers[k])
        self.in_place += not moved
        result = list(self.template)
        for i, k in self.wholes:  # the input itself (the key holds its sizes and strides);
            x = inputs[k]  # rebuild's write-back then finds it
            result[i] = x if not x.requires_grad else self._hand_out(self.outputs[i], inputs)
        for i, out in self.others:
            result[i] = self._hand_out(out, inputs)
        return tuple(result)

    def _invalidate_handed(self) -> None:
        for ref in self.handed:
            if not ref.expired():
                _invalidate(ref.cdata, STALE)
        self.handed = []

    def _hand_out(self, out: _Output, inputs: list) -> Any:
        t = out.tensor
        if out.input is not None:  # a view of an input: of the caller's tensor
            x = inputs[out.input]
            return x.as_strided(t.shape, t.stride(), x.storage_offset() + out.offset)
        storage = t.untyped_storage()
        fresh = _storage_at(storage.data_ptr(), t.device, storage.nbytes())
        result = torch.empty((0,), dtype=t.dtype, device=t.device)
        result.set_(fresh, out.offset, t.shape, t.stride())
        self.handed.append(torch.multiprocessing.reductions.StorageWeakRef(fresh))
        return result


class GraphedCall:
    """``call(inputs)`` recorded and replayed as CUDA graphs (see the module docstring)."""

    def __init__(self, call: Callable[[list], tuple], name: str, static: frozenset[int],
                 mutated: frozenset[int] = frozenset()) -> None:
        self.call = call
        self.name = name
        self.static, self.mutated = static, mutated
        self.recorded: dict[tuple, Recorded] = {}
        self.warm: set[tuple] = set()
        self.off: str | None = None  # why this graph runs the ordinary path from now on
        self.state: frozenset[int] = frozenset()  # updated inputs read in place (a KV cache)
        # The static tensors, the other tensors and the rest (sizes), picked from the inputs
        # (whose kinds the entry's guards keep), and the static ones' positions: set at the
        # first call.
        self.picks: tuple[Callable[[list], tuple], ...] | None = None
        self.static_at: list[int] = []
        # The last key's other parts, its static addresses, and those by input position.
        self.last: tuple[tuple, tuple, list] | None = None

    def key(self, inputs: list) -> tuple:
        """The static inputs' addresses, the others' sizes and strides, the rest's values.
        The addresses (a model's parameters: 148 for GPT-2 small) are compared with the last
        key's in one C++ call (compat.addresses_equal), read one by one only where one
        moved (``.data =``)."""
        if self.picks is None:
            tensors = [k for k, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
            self.static_at = [k for k in tensors if k in self.static]
            self.picks = (picker(self.static_at),
                          picker([k for k in tensors if k not in self.static]),
                          picker([k for k, x in enumerate(inputs) if k not in tensors]))
        static, tensors, rest = self.picks
        tensors = tensors(inputs)
        other = (tuple(map(_shape, tensors)), tuple(map(_stride, tensors)), rest(inputs))
        last = self.last
        if last is not None and last[0] == other and compat.addresses_equal(
                inputs, last[2], self.static_at):
            return (last[1], *other)
        addresses = tuple(map(_data_ptr, static(inputs)))
        at: list = [None] * len(inputs)
        for k, address in zip(self.static_at, addresses):
            at[k] = address
        self.last = (other, addresses, at)
        return (addresses, *other)

    def __call__(self, inputs: list) -> tuple:
        if self.off is not None:
            return self.call(inputs)
        key = self.key(inputs)
        graph = self.recorded.get(key)
        if graph is not None:
            now = graph.addresses(inputs)
            outs = graph.replay(inputs, now)
            if outs is not None:
                return outs
            # A new static or state input records again on the caller's tensors; else the
            # graph gets buffers of its own for all but the updated inputs that are still
            # the recorded tensors (a KV cache is not copied in and back at each step
            # because a token's tensor from the recording call is still held).
            self.state |= graph.learned_state()
            moved = graph.moved_pinned(now) or graph.moved_state(now)
            return self.record(key, inputs, frozenset() if moved else graph.to_own(now))
        if key not in self.warm:
            reason = why_not(inputs)
            if reason is not None:
                return self.turn_off(reason, inputs)
            self.warm.add(key)
            return self.call(inputs)
        if len(self.recorded) >= LIMIT:
            trace.emit("cudagraphs", self.name,
                       f"{LIMIT} graphs recorded already: these sizes run without CUDA graphs")
            return self.call(inputs)
        return self.record(key, inputs, frozenset())

    def record(self, key: tuple, inputs: list, own: frozenset[int]) -> tuple:
        old = self.recorded.pop(key, None)
        if old is not None:
            old._invalidate_handed()
        try:
            graph = Recorded(self.call, inputs, self.static, self.mutated, own, self.state)
        except RuntimeError as e:  # e.g. a library call that synchronizes while recording
            return self.turn_off(f"recording failed: {str(e).splitlines()[0]}", inputs)
        self.recorded[key] = graph
        trace.emit("cudagraphs", self.name, f"recorded graph {len(self.recorded)}: "
                   f"{len(graph.copied) - len(own)} inputs read from the recording call's "
                   f"tensors, {len(own)} from buffers of its own, "
                   f"{len(inputs) - len(graph.copied)} (parameters, buffers) in place")
        outs = graph.replay(inputs, graph.addresses(inputs))
        assert outs is not None  # just recorded on these inputs
        return outs

    def turn_off(self, reason: str, inputs: list) -> tuple:
        self.off = reason
        trace.emit("cudagraphs", self.name, f"runs without CUDA graphs: {reason}")
        return self.call(inputs)
