"""Warm entries: whole compiled entries on disk, loaded by a new process without capture.

When a frame compiles whole (no graph break, no backward graph), its entry is written under
``<cache>/entries/<function key>/``: the guard checks (plain Python), ``get_inputs`` and
``rebuild`` (plain Python), the objects their namespace refers to as *recipes* (how to find
them again: a module by name, a function by module and qualified name, a device by its
string...), the wrapper module and C++ library with their sha256, and the cache key of each
GPU kernel's cubin (so that loading it hashes no kernel text).  A later process that
calls the same function looks there first: it rebuilds the namespace, re-evaluates the
guards on the call, and on a pass imports the wrapper and runs, with no bytecode
interpreted, no metadata inferred and nothing built.

The function key covers the function's code (``marshal`` of the code object: bytecode,
constants, names, file and line table), the configuration, the tool versions
(:func:`~minicompile.runtime.cache.tool_versions`) and minicompile's own source.  Every
other function the trace inlined must be found again by a recipe that checks its code
(functions by their code and defaults, classes by the code of their methods), or live in
PyTorch, Triton or the standard library (covered by the versions).  Anything else is not
stored, with the reason under ``MINICOMPILE_LOGS=cache``: modules, parameters or other
objects known only by identity, functions made at run time.  When unsure, miss.

Nothing is unpickled: an entry is JSON, its code is the generated source minicompile
wrote (the guard function also compiled, as ``marshal`` data like Python's own ``.pyc``
files), and recipes only look objects up in modules already imported.  An entry that does
not match its checksum (truncated, half-written, edited) gives one warning and is
rebuilt, never loaded.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import enum
import json
import marshal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minicompile import trace
from minicompile.config import Config
from minicompile.runtime import build, cache, fingerprints, profile, reach, values  # noqa: F401 (values:
# what generated rebuilds call, found by recipes in a process that never captured)
from minicompile.runtime.fingerprints import Miss, NotStorable, lookup
from minicompile.runtime.guards import GLOBAL_MODULE_HOOKS, GUARDS_FILENAME, GuardCheck, Guards
from minicompile.runtime.tensor_checks import PYTHON_CHECKS, TENSOR_CHECKS

FORMAT = "minicompile-entry-1"
_SKIP = frozenset({"__builtins__", "check", "get_inputs", "rebuild", TENSOR_CHECKS,
                   PYTHON_CHECKS})


# -- keys ----------------------------------------------------------------------------------


def function_key(fn: types.FunctionType, cfg: Config) -> str:
    """Where the entries of ``fn`` compiled under ``cfg`` are filed."""
    options = (cfg.backend, cfg.dynamic, cfg.fullgraph, cfg.mode, cfg.cxx, cfg.cxx_flags,
               cfg.horizontal_fusion, cfg.store_in_place, cfg.triton_interpret, cfg.check,
               cfg.layout_opt, cfg.gemm_padding, cfg.fold_batch_norm)
    return cache.cache_key(FORMAT, fingerprints.code_digest(fn.__code__), fn.__module__ or "",
                           repr(options), cache.tool_versions(cfg.cxx),
                           fingerprints.source_version())


# -- recipes: how to find a namespace object again -----------------------------------------


def recipe(obj: Any, fn: types.FunctionType) -> list:
    """How a new process finds ``obj`` again (raises NotStorable when it cannot)."""
    if obj is fn.__globals__:
        return ["fn_globals"]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if obj is cell:
            return ["cell", name]
    if obj is GLOBAL_MODULE_HOOKS:
        return ["global_hooks"]
    if isinstance(obj, torch.device):
        return ["device", str(obj)]
    if isinstance(obj, float):
        return ["float", repr(obj)]
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is obj:
            return ["module", obj.__name__]
        raise NotStorable(f"module {obj.__name__} is not the one imported under its name")
    if isinstance(obj, dict):
        for name, module in list(sys.modules.items()):
            if getattr(module, "__dict__", None) is obj:
                return ["module_dict", name]
        raise NotStorable("a dict known by identity (not a module's globals)")
    if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
        return ["torch", str(obj).removeprefix("torch.")]
    if isinstance(obj, enum.Enum):  # a member (``mode is Action.NONE``): its class's, by name
        cls = type(obj)
        return ["member", recipe(cls, fn), obj.name]
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module is None and hasattr(obj, "__objclass__"):  # a C method: ``dict.get``
        module = obj.__objclass__.__module__
    if module == "builtins" and isinstance(obj, type) and (
            getattr(builtins, obj.__qualname__, None) is not obj):
        # (``type(f.__code__) is code``: the types module names classes builtins doesn't)
        module, qualname = "types", next((k for k, v in vars(types).items() if v is obj), None)
    if isinstance(module, str) and isinstance(qualname, str):
        try:
            found = lookup(module, qualname)
        except Miss as e:
            raise NotStorable(f"{type(obj).__name__} {qualname}: {e}") from None
        if found is obj:
            return ["object", module, qualname, fingerprints.object_digest(obj)]
    raise NotStorable(f"a {type(obj).__name__} known only by identity ({_short(obj)})")


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve(r: list, fn: types.FunctionType) -> Any:
    """The object recipe ``r`` names in this process (raises Miss)."""
    kind = r[0]
    if kind == "fn_globals":
        return fn.__globals__
    if kind == "cell":
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        if r[1] not in cells:
            raise Miss(f"no closure cell {r[1]}")
        return cells[r[1]]
    if kind == "global_hooks":
        return GLOBAL_MODULE_HOOKS
    if kind == "device":
        return torch.device(r[1])
    if kind == "float":
        return float(r[1])
    if kind == "module":
        if r[1] not in sys.modules:
            raise Miss(f"module {r[1]} is not imported")
        return sys.modules[r[1]]
    if kind == "module_dict":
        if r[1] not in sys.modules:
            raise Miss(f"module {r[1]} is not imported")
        return vars(sys.modules[r[1]])
    if kind == "torch":
        found = getattr(torch, r[1], None)
        if not isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            raise Miss(f"torch.{r[1]} is not a dtype, layout or memory format")
        return found
    if kind == "fn":
        return fn
    if kind == "reach":  # a cell, function or code object on a path from an anchor
        found = reach.follow(resolve(r[1], fn), r[2])
        if isinstance(found, types.CodeType):
            if fingerprints.code_digest(found) != r[3]:
                raise Miss(f"code at {r[2]} changed since the entry was written")
            return found
        return found if isinstance(found, types.CellType) else _same_object(found, r[3], str(r[2]))
    if kind == "member":
        cls = resolve(r[1], fn)
        if not (isinstance(cls, enum.EnumMeta) and r[2] in cls.__members__):
            raise Miss(f"{cls!r} has no member {r[2]}")
        return cls[r[2]]
    if kind == "object":
        return _same_object(lookup(r[1], r[2]), r[3], f"{r[1]}.{r[2]}")
    raise Miss(f"unknown recipe {kind!r}")


def _same_object(found: Any, digest: str, where: str) -> Any:
    """``found`` if its fingerprint is ``digest`` (raises Miss)."""
    try:
        if fingerprints.object_digest(found) == digest:
            return found
    except NotStorable as e:
        raise Miss(str(e)) from None
    raise Miss(f"{where} changed since the entry was written")


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


def save(stored: Stored, cfg: Config) -> Path | None:
    """Write the entry; returns its path, or None (with the reason logged) when it cannot
    be stored or the cache refuses it."""
    name = stored.fn.__qualname__
    try:
        payload = _payload(stored, cfg)
    except NotStorable as e:
        trace.emit("cache", name, f"not stored on disk: {e}")
        return None
    except Exception as e:  # never the user's call's problem: it ran already
        trace.emit("cache", name, f"not stored on disk: {type(e).__name__}: {e}")
        return None
    text = json.dumps(payload, sort_keys=True).encode()
    checksum = cache.sha256_bytes(text)
    # A header line, then the payload: read once, checked before it is parsed.
    data = json.dumps({"format": FORMAT, "checksum": checksum}).encode() + b"\n" + text
    parts = ("entries", function_key(stored.fn, cfg))
    if len(_entry_files(cfg, parts)) >= cfg.recompile_limit:
        trace.emit("cache", name, f"not stored on disk: {cfg.recompile_limit} entries of this "
                   f"function are there already (the recompile limit)")
        return None
    try:
        path = cache.store(cfg.cache_dir, parts, f"{checksum[:32]}.json", data)
    except OSError as e:
        trace.emit("cache", name, f"not stored on disk: {e}")
        return None
    trace.emit("cache", name, f"stored as {path}")
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
            namespace[k] = recipe(v, fn)
        except NotStorable:
            unnamed[k] = v
        keyed.append(v)
    anchors = [(guards.namespace[k], r) for k, r in namespace.items()]
    recipes, objects = _module_recipes(modules, guards)
    namespace.update(recipes)
    namespace.update(_reach_recipes(unnamed, fn, anchors, modules.values()))
    _check_codes_covered(capture.codes, keyed + objects)
    loaded = stored.loaded
    return {
        "name": fn.__qualname__,
        "params": list(guards.params),
        "checks": [[c.source, c.kind, c.expr, c.actual, _jsonable(c.expected), c.tensor]
                   for c in guards.checks],
        # The guard function compiled (its source is rendered from the checks again).
        "guard_code": base64.b64encode(marshal.dumps(guards.code)).decode(),
        "get_inputs": capture.get_inputs_source,
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
    }


def _reach_recipes(unnamed: dict[str, Any], fn: types.FunctionType,
                   named: list[tuple[Any, list]], modules: Any) -> dict[str, list]:
    """Recipes for objects of no name of their own (runtime/reach.py): paths from the
    compiled function, the functions and classes named, and the classes of the modules."""
    if not unnamed:
        return {}
    anchors = [(fn, ["fn"]), *((o, r) for o, r in named if isinstance(o, (types.FunctionType, type)))]
    for cls in {type(m): None for m in modules}:
        try:
            anchors.append((cls, recipe(cls, fn)))
        except NotStorable:
            continue
    out = {}
    for name, obj in unnamed.items():
        found = reach.find(obj, anchors)
        if found is None:
            recipe(obj, fn)  # raises NotStorable, with its reason
        digest = fingerprints.code_digest(obj) if isinstance(obj, types.CodeType) else (
            "" if isinstance(obj, types.CellType) else fingerprints.object_digest(obj))
        out[name] = ["reach", *found, digest]
    return out


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
    return ["shown", repr(value) if not isinstance(value, (torch.dtype, torch.device, type))
            else _shown(value)]


def _shown(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


class _Shown(str):
    """A traced value kept as its text, for failure messages."""

    def __repr__(self) -> str:
        return str(self)


def _expected(value: Any) -> Any:
    if isinstance(value, list):
        if len(value) == 2 and value[0] == "shown":
            return _Shown(value[1])
        return tuple(value)
    return value


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


@dataclasses.dataclass
class Warm:
    capture: WarmCapture
    run: Callable[[tuple], Any]
    call: Callable[[list], tuple]
    sizes: list
    kernels: int


def load_all(fn: types.FunctionType, cfg: Config, frame: tuple) -> list[Warm]:
    """Every valid entry stored for ``fn`` under ``cfg``, newest first, its modules those
    of ``frame`` (the call that looks).  An entry that fails its checksum is removed with a
    warning; one whose recipes find nothing (a module not imported, a function changed, a
    module of another fingerprint) is skipped, with the reason logged."""
    found = _entry_files(cfg, ("entries", function_key(fn, cfg)))
    if not found:
        return []
    out = []
    for path in sorted(found, key=_mtime, reverse=True):
        try:
            out.append(_load(path, fn, cfg, frame))
        except cache.CacheCorrupted as e:  # the entry, or a file it names
            cache.warn_corrupted(e.path)
            cache.discard(path)
        except (Miss, NotStorable) as e:
            trace.emit("cache", fn.__qualname__, f"entry {path.name} not used: {e}")
        except Exception as e:  # an entry this process cannot use is a miss, never an error
            trace.emit("cache", fn.__qualname__,
                       f"entry {path.name} not used: {type(e).__name__}: {e}")
    return out


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


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _load(path: Path, fn: types.FunctionType, cfg: Config, frame: tuple) -> Warm:
    try:
        header, _, text = path.read_bytes().partition(b"\n")
        head = json.loads(header)
        ok = head["format"] == FORMAT and cache.sha256_bytes(text) == head["checksum"]
        p = json.loads(text) if ok else None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise cache.CacheCorrupted(path, f"unreadable: {type(e).__name__}") from e
    if not ok:
        raise cache.CacheCorrupted(path, "does not match its checksum")
    # The generated module first: its kernels loaded, then what it prepares in threads
    # (library plans) runs while the rest of the entry loads.
    module = _verified(cfg, p["module"])
    libs = tuple(_verified(cfg, a) for a in p["libs"])
    if p["interpret"] and not cfg.triton_interpret:
        raise Miss("the entry runs under Triton's interpreter, which is off")
    key = module.stem.removeprefix("mc_")
    symbols = {name: (i, symbol) for name, (i, symbol) in p["symbols"].items()}
    loaded = build.load_module(key, module, libs, symbols, p["interpret"])
    if not p["interpret"]:
        build.ready_launches(loaded, p.get("builds"))
    namespace: dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor}
    modules = {k: r for k, r in p["namespace"].items() if r[0] == "frame_module"}
    for name, r in p["namespace"].items():
        if name not in modules:
            namespace[name] = resolve(r, fn)
    walked: set[int] = set()  # modules inside a module whose fingerprint matched
    order = sorted(modules.items(), key=lambda kv: len(kv[1][1]))
    values = _frame_values(p["params"], [where for _, (_, where, _) in order], namespace, frame)
    for (name, (_, where, digest)), found in zip(order, values):
        _check_module(where, digest, found, walked)
        namespace[name] = found
        if id(found) not in walked:  # (else its submodules are there already)
            walked.update(id(m) for m in found.modules())
    checks = [GuardCheck(s, k, e, a, _expected(x), t) for s, k, e, a, x, t in p["checks"]]
    code = marshal.loads(base64.b64decode(p["guard_code"]))
    if not isinstance(code, types.CodeType) or code.co_filename != GUARDS_FILENAME:
        raise cache.CacheCorrupted(path, "holds no guard function")
    guards = Guards(p["params"], checks, namespace, code)
    exec(compile(p["rebuild"], "<minicompile rebuild>", "exec"), namespace)
    exec(compile(p["get_inputs"], "<minicompile inputs>", "exec"), namespace)
    get_inputs, rebuild = namespace["get_inputs"], namespace["rebuild"]
    capture = WarmCapture(guards, get_inputs, rebuild, p["input_sources"], p["get_inputs"],
                          p["rebuild"], handlers=p.get("handlers", True))
    call = profile.profiled(loaded.call, loaded.call, fn.__qualname__, cfg)
    if p.get("derived"):  # (graph and ops, which import sympy, only for such entries)
        from minicompile.graph import graph_from_json
        from minicompile.runtime.derived import WithDerived

        d = p["derived"]
        call = WithDerived(call, graph_from_json(d["graph"]), tuple(d["positions"]))
    run = inference_runner(call, get_inputs, rebuild, p["no_grad"])
    return Warm(capture, run, call, [tuple(s) for s in p["sizes"]], p["kernels"])


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
    nothing is recorded."""
    if no_grad:
        off = torch.no_grad

        def run(frame: tuple) -> Any:
            with off():
                outs = call(get_inputs(*frame))
            return rebuild(outs, *frame)

        return run

    def run(frame: tuple) -> Any:
        return rebuild(call(get_inputs(*frame)), *frame)

    return run
