"""Warm entries: whole compiled entries on disk, loaded by a new process without capture.

A frame compiled whole (no graph break, no backward graph) is written under
``<cache>/entries/<function key>/`` as JSON: the guard checks, ``get_inputs`` and ``rebuild``
(plain Python; the guard function and ``get_inputs`` compiled too), *recipes* for the
objects their namespace refers to (runtime/recipes.py), the wrapper module and C++ library
with their sha256, and each GPU kernel's cubin key.  A
later process whose call no entry in memory matches looks there, newest first (:func:`find`),
re-evaluates an entry's guards on the call and, on a pass, runs its wrapper: nothing is
interpreted, inferred or built.  What a process decides and counts is the same without it.

The folder is keyed by the function's code; each entry's header holds its options, the tool
versions and minicompile's source, so another entry is passed over with the reason said.
Objects known only by identity (modules, parameters, functions made at run time) are not
stored, with the reason under ``MINICOMPILE_LOGS=cache``: when unsure, miss.  Nothing is
unpickled; an entry that fails its checksum gives one warning and is rebuilt, never loaded.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gc
import json
import marshal
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from minicompile import heap, trace
from minicompile.config import Config
from minicompile.runtime import build, cache, cache_limits, fingerprints, profile, recipes
from minicompile.runtime import values  # noqa: F401 (what generated rebuilds call, found by
# recipes in a process that never captured)
from minicompile.runtime.dict_guards import right_after_check
from minicompile.runtime.fingerprints import Miss, NotStorable
from minicompile.runtime.guards import GUARDS_FILENAME, GuardCheck, Guards
from minicompile.runtime.tensor_checks import PYTHON_CHECKS, TENSOR_CHECKS

FORMAT = "minicompile-entry-3"
_SKIP = frozenset({"__builtins__", "check", "get_inputs", "rebuild", TENSOR_CHECKS,
                   PYTHON_CHECKS})
# The options an entry was compiled under (checked when it is read; ``dynamic`` among them).
OPTIONS = ("backend", "dynamic", "fullgraph", "mode", "cxx", "cxx_flags", "horizontal_fusion",
           "store_in_place", "triton_interpret", "check", "layout_opt", "gemm_padding",
           "fold_batch_norm")


# -- keys ----------------------------------------------------------------------------------


def function_key(fn: types.FunctionType) -> str:
    """Where the entries of ``fn`` are filed: by its code alone, so that entries of other
    options and of older versions share one folder (and its bound, cache_limits.py), and a
    miss says which of them was not used and why."""
    return cache.cache_key(FORMAT, fingerprints.code_digest(fn.__code__), fn.__module__ or "")


def _options(cfg: Config) -> dict[str, str]:
    return {name: repr(getattr(cfg, name)) for name in OPTIONS}


def _versions(cfg: Config) -> str:
    """The tool versions (:func:`~minicompile.runtime.cache.tool_versions`) and
    minicompile's own source, as one key."""
    return cache.cache_key(cache.tool_versions(cfg.cxx), fingerprints.source_version())


# -- writing -------------------------------------------------------------------------------


@dataclasses.dataclass
class Stored:
    """What the API hands over about a compiled entry, to write it."""

    fn: types.FunctionType
    capture: Any  # minicompile.capture.Capture
    loaded: build.Loaded
    interpret: bool
    no_grad: bool  # run the call under torch.no_grad() (inputs require grad, grad mode off)
    kernels: int
    sizes: list
    derived: Any = None  # the runtime.derived.WithDerived of a graph with hoisted values
    # What automatic dynamic decided for this compile (AutoDynamic.decision): a later
    # process uses the entry only for a call it would decide the same for.
    dynamic: dict | None = None


def save(stored: Stored, cfg: Config) -> Path | None:
    """Write the entry; returns its path, or None (with the reason logged) when it cannot
    be stored or the cache refuses it.  The function's least recently used entries go
    first where it has ``cache_max_entries`` already (runtime/cache_limits.py)."""
    name = stored.fn.__qualname__
    try:
        with fingerprints.remembering():
            payload = _payload(stored, cfg)
    except Exception as e:  # never the user's call's problem: it ran already
        why = e if isinstance(e, NotStorable) else f"{type(e).__name__}: {e}"
        trace.emit("cache", name, f"not stored on disk: {why}")
        return None
    text = json.dumps(payload, sort_keys=True).encode()
    checksum = cache.sha256_bytes(text)
    # A header line, then the payload: read once, checked before it is parsed.
    head = {"format": FORMAT, "checksum": checksum, "options": _options(cfg),
            "versions": _versions(cfg)}
    data = json.dumps(head).encode() + b"\n" + text
    parts, file = ("entries", function_key(stored.fn)), f"{checksum[:32]}.json"
    folder = cfg.cache_dir.joinpath(*parts)
    if not (folder / file).exists():  # (the same entry again replaces itself)
        cache_limits.make_room(folder, cfg.cache_max_entries, name)
    try:
        path = cache.store(cfg.cache_dir, parts, file, data)
    except OSError as e:
        trace.emit("cache", name, f"not stored on disk: {e}")
        return None
    trace.emit("cache", name, f"stored as {path}")
    cache_limits.entry_stored(cfg)
    return path


def _payload(stored: Stored, cfg: Config) -> dict:
    capture, fn = stored.capture, stored.fn
    guards = capture.guards
    namespace, keyed, modules, unnamed = {}, [fn], {}, {}
    for k, v in guards.namespace.items():
        if k in _SKIP:
            continue
        if isinstance(v, torch.nn.Module):
            modules[k] = v
            continue
        try:
            namespace[k] = recipes.recipe(v, fn)
        except NotStorable:
            unnamed[k] = v
        keyed.append(v)
    anchors = [(guards.namespace[k], r) for k, r in namespace.items()]
    found, objects = _module_recipes(modules, guards)
    namespace.update(found)
    owners: list = []
    namespace.update(recipes.reached(unnamed, fn, anchors, modules.values(), owners))
    _check_codes_covered(capture.codes, keyed + objects + owners)
    loaded = stored.loaded
    return {
        "name": fn.__qualname__,
        "params": list(guards.params),
        "checks": [[c.source, c.kind, c.expr, c.actual, _jsonable(c.expected), c.tensor]
                   for c in guards.checks],
        # The guard function compiled (its source is rendered from the checks again).
        "guard_code": _code_text(guards.code),
        "guard_paths": guards.analysis.to_json(),  # (no parse of the checks when loaded)
        "get_inputs": capture.get_inputs_source,
        # (compiled too, as guard_code: densenet121's takes 7 ms to compile)
        "get_inputs_code": _code_text(guards.namespace["get_inputs"].__code__),
        "input_items": guards.input_items,  # (what get_inputs lists)
        "rebuild": capture.rebuild_source,
        "namespace": namespace,
        "input_sources": list(capture.input_sources),
        "sizes": [list(s) for s in stored.sizes],
        "no_grad": stored.no_grad,
        "interpret": stored.interpret,
        "kernels": stored.kernels,
        "handlers": capture.handlers,
        "module": _artefact(loaded.module_path, cfg),
        "libs": [_artefact(p, cfg) for p in loaded.lib_paths],
        "symbols": loaded.symbols,
        "builds": {} if stored.interpret else build.launch_builds(loaded),
        "derived": _derived_payload(stored.derived),
        "dynamic": stored.dynamic,
        "size_symbols": size_symbols(capture),
    }


def size_symbols(capture: Any) -> list[str]:
    """Where the size symbols of an entry's capture are read (``L['x'].shape[0]``, in
    trace order), of a compiled capture or a WarmCapture (which keeps the list)."""
    if isinstance(capture, WarmCapture):
        return capture.size_symbols
    shapes = capture.graph.shapes
    return [] if shapes is None else [where.name for where in shapes.sources.values()]


def _derived_payload(derived: Any) -> dict | None:
    """The graph of values computed from parameters (runtime/derived.py), and where its
    inputs are among the entry's, as JSON."""
    if derived is None:
        return None
    from minicompile.graph import graph_to_json

    try:
        graph = graph_to_json(derived.graph)
    except ValueError as e:
        raise NotStorable(f"its values computed from parameters: {e}") from None
    return {"graph": graph, "positions": list(derived.positions)}


def _module_recipes(modules: dict[str, torch.nn.Module],
                    guards: Guards) -> tuple[dict[str, list], list]:
    """Modules the guards hold by identity (``L_self is MLP``): a new process finds each
    module passed at the same place of the frame, and uses the entry only where its
    fingerprint (fingerprints.ModuleWalk) is the one traced; the identity guard then holds
    that module, as the in-memory entry holds this one.  Returns the recipes and the
    functions and classes the fingerprints met.

    Modules are walked outermost first: a walk fingerprints the modules inside it on the
    way (resnet50's guards hold 217 modules; walking each alone walked the model five
    times over)."""
    where: dict[str, str] = {}  # namespace name -> the first place an identity guard reads
    for c in guards.checks:
        if c.kind == "identity" and c.expr.startswith(f"{c.actual} is "):
            where.setdefault(c.expr[len(c.actual) + 4:], c.actual)
    recipes, objects, digests = {}, [], {}
    for name in sorted(modules, key=lambda n: len(where.get(n, ""))):
        module = modules[name]
        if name not in where:
            raise NotStorable(f"module {type(module).__qualname__} is not reached from the "
                              f"frame")
        digest = digests.get(id(module))
        if digest is None:  # (one met inside a module walked already: its objects too)
            walk = fingerprints.ModuleWalk(module, inner=True)
            digests.update(walk.digests)
            objects += walk.objects
            digest = walk.digest
        recipes[name] = ["frame_module", where[name], digest]
    return recipes, objects


def _check_codes_covered(codes: frozenset, objects: list) -> None:
    """Every code object the trace interpreted is keyed: the function's own (nested code
    included), code of functions and classes found again by recipes that check it (or met
    in a module's fingerprint), or code of PyTorch, Triton and the standard library (keyed
    by their versions)."""
    unversioned = [c for c in codes if not fingerprints.versioned(c.co_filename)]
    if not unversioned:
        return
    covered, done = set(), set()
    for obj in objects:  # (the same classes come again and again: once each)
        if id(obj) not in done:
            done.add(id(obj))
            covered.update(id(c) for c in fingerprints.codes_of(obj))
    for code in unversioned:
        if id(code) not in covered:
            name = getattr(code, "co_qualname", code.co_name)
            raise NotStorable(f"the trace inlined {name} ({code.co_filename}:"
                              f"{code.co_firstlineno}), which no recipe checks")


def _artefact(path: Path, cfg: Config) -> dict:
    try:
        rel = path.relative_to(cfg.cache_dir)
    except ValueError:
        raise NotStorable("its code was built outside the cache directory") from None
    digest = cache.sha256_file(path)
    if digest is None:
        raise NotStorable(f"{path} cannot be read back")
    return {"path": str(rel), "sha256": digest}


def _jsonable(value: Any) -> Any:
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float and value == value and abs(value) != float("inf"):
        return value
    if isinstance(value, (tuple, list, torch.Size)) and all(type(v) is int for v in value):
        return list(value)
    if isinstance(value, type):
        return ["shown", f"{value.__module__}.{value.__qualname__}"]
    if isinstance(value, torch.nn.Module):  # (a model's repr, its submodules' in it: 45 KB)
        return ["shown", f"<{type(value).__qualname__} module>"]
    return ["shown", str(value) if isinstance(value, (torch.dtype, torch.device)) else repr(value)]


class _Shown(str):
    """A traced value kept as its text, for failure messages."""

    def __repr__(self) -> str:
        return str(self)


def _expected(value: list) -> Any:
    if len(value) == 2 and value[0] == "shown":
        return _Shown(value[1])
    return tuple(value)


# -- reading -------------------------------------------------------------------------------


@dataclasses.dataclass
class WarmCapture:
    """What the API reads of an entry's capture, for an entry loaded from disk (there is no
    graph: nothing was traced)."""

    guards: Guards
    get_inputs: Callable[..., list]
    rebuild: Callable[..., Any]
    input_sources: list[str]
    get_inputs_source: str
    rebuild_source: str
    graph: Any = None
    instructions: int = 0
    compiled: Any = None
    writebacks: tuple = ()
    codes: frozenset = frozenset()
    handlers: bool = True  # (see Capture.handlers)
    size_symbols: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Warm:
    capture: WarmCapture
    run: Callable[[tuple], Any]
    call: Callable[[list], tuple]
    sizes: list
    kernels: int
    path: Path  # the entry's file
    files: tuple[Path, ...]  # the files it names (wrapper module, C++ libraries)


def find(fn: types.FunctionType, cfg: Config, frame: tuple, skip: set[Path],
         decide: Callable[[WarmCapture], dict | None]) -> Warm | None:
    """The newest entry of ``fn`` on disk (not in ``skip``) that ``frame`` can use, loaded;
    None when there is none.  An entry is used where it was written by this version under
    these options, its recipes find their objects, its guards pass on ``frame``, and its
    dynamic-shape decision is this call's (``decide``).  Every entry passed over says why
    under ``MINICOMPILE_LOGS=cache``; one that does not read back whole is removed with a
    warning.  The entry used is marked used (cache_limits.py)."""
    name = fn.__qualname__
    found = _entry_files(cfg, ("entries", function_key(fn)))
    for path in sorted(found, key=lambda p: cache.last_used(p) or 0.0, reverse=True):
        if path in skip:
            continue
        try:
            with fingerprints.remembering(), _no_collections():
                warm = _load(path, fn, cfg, frame, decide)
        except cache.CacheCorrupted as e:  # the entry, or a file it names
            cache.warn_corrupted(e.path)
            cache.discard(path)
            reason = f"{e} (removed)"
        except (Miss, NotStorable) as e:
            reason = str(e)
        except Exception as e:  # an entry this process cannot use is a miss, never an error
            reason = f"{type(e).__name__}: {e}"
        else:
            for used in (path, *warm.files):
                cache.mark_used(used)
            symbolic = ", ".join(warm.capture.size_symbols) or "none"
            trace.emit("cache", name, f"entry {path.name} loaded (sizes symbolic: {symbolic})")
            return warm
        trace.emit("cache", name, f"entry {path.name} not used: {reason}")
    return None


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """No collection while an entry loads, and what a load makes counted as old after it
    (heap.refreeze): it lives on, and densenet121's load ran 200 collections, 0.03 s of
    CPU time, and one of 10-20 ms after it.  A collector turned off stays off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        heap.refreeze()
    finally:
        if enabled:
            gc.enable()


def _entry_files(cfg: Config, parts: tuple[str, ...]) -> list[Path]:
    """The entry files under ``parts``, in the cache directory or this process's private
    one."""
    found = []
    for base in cache.places(cfg.cache_dir):
        try:
            found += list(base.joinpath(*parts).glob("*.json"))
        except OSError:
            continue
    return found


def _read(path: Path, cfg: Config) -> dict:
    """The payload of entry ``path``: Miss for an entry of another version or other
    options (its header says, read alone), CacheCorrupted for one that does not read back
    whole."""
    try:
        with path.open("rb") as f:
            head = json.loads(f.readline())
            refusal = _refusal(head, cfg)
            text = b"" if refusal else f.read()
    except FileNotFoundError:
        raise Miss("removed meanwhile (by another process)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise cache.CacheCorrupted(path, f"unreadable: {type(e).__name__}") from e
    if refusal:
        raise Miss(refusal)
    if cache.sha256_bytes(text) != head["checksum"]:
        raise cache.CacheCorrupted(path, "does not match its checksum")
    return json.loads(text)


def _refusal(head: dict, cfg: Config) -> str | None:
    if head["format"] != FORMAT or head["versions"] != _versions(cfg):
        return "written by another version of minicompile, PyTorch, Triton, Python or the C++ "\
               "compiler"
    stored, now = head["options"], _options(cfg)
    other = [f"{k}={stored.get(k)} (this call: {v})" for k, v in now.items()
             if stored.get(k) != v]
    return f"compiled with other options: {', '.join(other)}" if other else None


def _load(path: Path, fn: types.FunctionType, cfg: Config, frame: tuple,
          decide: Callable[[WarmCapture], dict | None]) -> Warm:
    p = _read(path, cfg)
    if p["interpret"] and not cfg.triton_interpret:
        raise Miss("the entry runs under Triton's interpreter, which is off")
    namespace = _namespace(p, fn, frame)
    checks = [GuardCheck(s, k, e, a, x if type(x) is not list else _expected(x), t)
              for s, k, e, a, x, t in p["checks"]]
    code = _code(path, p["guard_code"], GUARDS_FILENAME)
    guards = Guards(p["params"], checks, namespace, code, p["guard_paths"])
    inputs = _code(path, p["get_inputs_code"], "<minicompile inputs>")
    namespace["get_inputs"] = types.FunctionType(inputs, namespace, "get_inputs")
    # (before the first check, whose record then renders get_inputs' fast form too)
    get_inputs = guards.reading(namespace["get_inputs"], p["input_items"])
    if not guards.check(*frame):
        raise Miss(f"guard failed: {guards.explain_failure(*frame) or 'the guard function'}")
    exec(compile(p["rebuild"], "<minicompile rebuild>", "exec"), namespace)
    rebuild = namespace["rebuild"]
    capture = WarmCapture(guards, get_inputs, rebuild, p["input_sources"], p["get_inputs"],
                          p["rebuild"], handlers=p["handlers"], size_symbols=p["size_symbols"])
    decided = decide(capture)
    if decided != p["dynamic"]:
        raise Miss(f"compiled when {_decided(p['dynamic'])}; for this call "
                   f"{_decided(decided)} (automatic dynamic shapes)")
    module = _verified(cfg, p["module"])
    libs = tuple(_verified(cfg, a) for a in p["libs"])
    key = module.stem.removeprefix("mc_")
    symbols = {name: (i, symbol) for name, (i, symbol) in p["symbols"].items()}
    loaded = build.load_module(key, module, libs, symbols, p["interpret"])
    if not p["interpret"]:
        build.ready_launches(loaded, p.get("builds"))
    call = profile.profiled(loaded.call, loaded.call, fn.__qualname__, cfg)
    if p.get("derived"):
        from minicompile.runtime.derived import WithDerived

        d = p["derived"]
        call = WithDerived.from_json(call, d["graph"], tuple(d["positions"]))
    run = inference_runner(call, get_inputs, rebuild, p["no_grad"])
    return Warm(capture, run, call, [tuple(s) for s in p["sizes"]], p["kernels"], path,
                (module, *libs))


def _code_text(code: types.CodeType) -> str:
    return base64.b64encode(marshal.dumps(code)).decode()


def _code(path: Path, text: str, filename: str) -> types.CodeType:
    """The code object :func:`_code_text` wrote, compiled from ``filename``."""
    code = marshal.loads(base64.b64decode(text))
    if not isinstance(code, types.CodeType) or code.co_filename != filename:
        raise cache.CacheCorrupted(path, f"holds no code of {filename}")
    return code


def _namespace(p: dict, fn: types.FunctionType, frame: tuple) -> dict[str, Any]:
    """The objects the entry's code refers to, found again by their recipes; the modules
    it holds by identity those of ``frame`` where their fingerprints match."""
    namespace: dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor}
    modules = {k: r for k, r in p["namespace"].items() if r[0] == "frame_module"}
    for name, r in p["namespace"].items():
        if name not in modules:
            namespace[name] = recipes.resolve(r, fn)
    walked: set[int] = set()  # modules inside a module whose fingerprint matched
    order = sorted(modules.items(), key=lambda kv: len(kv[1][1]))
    values = _frame_values(p["params"], [where for _, (_, where, _) in order], namespace, frame)
    for (name, (_, where, digest)), found in zip(order, values):
        _check_module(where, digest, found, walked)
        namespace[name] = found
        if id(found) not in walked:  # (else its submodules are there already)
            walked.update(id(m) for m in found.modules())
    return namespace


def _decided(d: dict | None) -> str:
    """Automatic dynamic's decision (AutoDynamic.decision), in words."""
    if d is None:
        return "`dynamic` decided alone"
    said = [f"{s} dim(s) {dims} had changed" for s, dims in d["dims"].items()]
    said += [f"{s} had changed" for s in d["ints"]]
    said += [f"{s} dim(s) {dims} were marked dynamic" for s, dims in d["marks"].items()]
    if d.get("lengths"):
        said.append(f"dims had changed from sizes {d['lengths']}")
    return ", ".join(said) or "no size had changed"


def _frame_values(params: list[str], wheres: list[str], namespace: dict,
                  frame: tuple) -> list:
    """The values of ``wheres`` (guards' expressions over the frame) in ``frame``: all by
    one compiled expression (a model's entry names hundreds of modules), or, when that
    fails, one by one, to name the one not found."""

    def finder(text: str) -> Callable:
        return eval(f"lambda {', '.join(params)}: {text}", namespace)

    try:
        return list(finder(f"({', '.join(wheres)},)")(*frame)) if wheres else []
    except Exception:  # noqa: BLE001, S110 (looked up one by one below)
        pass
    values = []
    for where in wheres:
        try:
            values.append(finder(where)(*frame))
        except Exception as e:  # another structure of arguments
            raise Miss(f"{where}: {type(e).__name__}") from None
    return values


def _check_module(where: str, digest: str, found: Any, walked: set[int]) -> None:
    """``found``, the value at ``where``, is a module whose fingerprint is ``digest`` (or
    part of a module in ``walked`` whose fingerprint, which covers its submodules,
    matched)."""
    if not isinstance(found, torch.nn.Module):
        raise Miss(f"{where} is not a module")
    if id(found) not in walked and fingerprints.module_digest(found) != digest:
        raise Miss(f"{where} ({type(found).__qualname__}) differs from the module traced")


def _verified(cfg: Config, artefact: dict) -> Path:
    rel = Path(artefact["path"])
    if rel.is_absolute() or ".." in rel.parts:
        raise cache.CacheCorrupted(rel, "names a file outside the cache directory")
    path = cache.find(cfg.cache_dir, rel.parent.parts, rel.name)
    if path is None:
        raise Miss(f"{rel} is not in the cache any more")
    cache.read_verified(path, artefact["sha256"])
    return path


def inference_runner(
    call: Callable[[list], tuple], get_inputs: Callable, rebuild: Callable, no_grad: bool
) -> Callable[[tuple], Any]:
    """The entry's run(frame) for a graph without a backward: inputs, the generated call,
    then rebuild.  ``no_grad``: inputs require grad but grad mode is off in the trace, so
    nothing is recorded.  The API runs an entry right after its check passed: the inputs
    read what a dict-version gate holds without asking it again (right_after_check)."""
    get_inputs = right_after_check(get_inputs)
    if no_grad:
        off, grad_enabled = torch.no_grad, torch.is_grad_enabled

        def run(frame: tuple) -> Any:
            if not grad_enabled():  # (generate's decode steps: no context manager to enter)
                return rebuild(call(get_inputs(*frame)), *frame)
            with off():
                outs = call(get_inputs(*frame))
            return rebuild(outs, *frame)

        return run

    def run(frame: tuple) -> Any:
        return rebuild(call(get_inputs(*frame)), *frame)

    return run
