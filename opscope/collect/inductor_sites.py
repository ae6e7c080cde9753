"""What each call site of an Inductor-compiled graph runs for: its modules and source lines.

With opscope imported, Inductor compiles CPU graphs with a range per generated
kernel (``config.cpp.enable_kernel_profile``: each ``cpp_fused_*`` kernel opens a
RecordFunction ``graph_<id>_<kernel>``, as under torch.profiler with that flag), and
opscope notes, as Inductor generates the code, each kernel call site in order: the
op it shows as (that range, or the ``aten::`` op of an extern call), the modules its
FX nodes came from (``nn_module_stack``; a backward node's forward modules,
``fwd_nn_module_stack``) and their source lines (``stack_trace``).

The notes go into the generated module itself, as lines of plain data
(``globals().setdefault("_opscope_sites", []).append((...))``), so a graph loaded
from Inductor's FX-graph cache by another process carries them too, and a process
without opscope that loads it only builds a list. ``post_compile`` registers every
compiled graph by the key its ``## Call CompiledFxGraph <key> ##`` range shows;
``sites_for(names)`` gives the recording those graphs' sites.

A graph compiled before ``import opscope`` has no sites: it stays at graph level.

Example (a site's shape)::

    >>> site_from_parts("graph_0_cpp_fused_add_0", [(("", "M"), ("0", "Block"))] * 2,
    ...                 ['  File "m.py", line 9, in forward\\n    x + y\\n'])
    ('graph_0_cpp_fused_add_0', ((2, (('', 'M'), ('0', 'Block'))),), ('m.py(9): forward',))
"""

from __future__ import annotations

import ast
import re
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.torch_names import (COMPILED_CALL_PREFIX, COMPILED_FRAME_PREFIX,
                                       compiled_graph_key)

SITES_GLOBAL = "_opscope_sites_v2"  # the version: a newer format is a new name
SITE_LINE_PREFIX = 'globals().setdefault("%s", []).append(' % SITES_GLOBAL
MAX_SITE_MODULES = 16  # module stacks noted per site (a fused kernel's distinct stacks)
MAX_SITE_FRAMES = 16

HOOKED = [False]  # set once every Inductor hook is in place (inductor_install)
Site = Tuple[str, Tuple[Tuple[Tuple[str, str], ...], ...], Tuple[str, ...]]

_lock = threading.Lock()
_graphs: "Dict[str, List[weakref.ref]]" = {}  # call-range key -> compiled graphs
_parsed: "weakref.WeakKeyDictionary[Any, Optional[List[Site]]]" = weakref.WeakKeyDictionary()
_ROOT_TOKEN = re.compile(r"L\[['\"][^'\"]*['\"]\]")  # Dynamo's name of the compiled frame's local
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def module_path(fqn: str, root: str) -> str:
    """Dynamo's module name (``L['self'].layers[0].fc``) as a path under its root.

    >>> module_path("L['self'].layers[0]._modules['fc']", "L['self']")
    'layers.0.fc'
    >>> module_path("getattr(L['fn'].blocks, '1').ln", "L['fn']")
    'blocks.1.ln'
    """
    text, root = _plain(fqn), _plain(root)
    text = text[len(root):] if root and text.startswith(root) else text
    return text.strip(".")


def _plain(fqn: str) -> str:
    """``getattr(a, 'b')``, ``._modules['b']``, ``['b']`` and ``[0]`` as ``a.b`` and ``.0``."""
    text = fqn
    while "getattr(" in text:
        new = re.sub(r"getattr\(([^(),]*),\s*'([^']*)'\)", r"\1.\2", text)
        if new == text:
            break
        text = new
    text = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", text)
    text = re.sub(r"\[['\"]([^'\"]+)['\"]\]", r".\1", text)
    return re.sub(r"\[(\d+)\]", r".\1", text)


def module_stack(meta: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    """An FX node's modules, outermost first, as ``(path, class)``: first the compiled
    root, ``("", class)`` (``""`` for the class when Dynamo did not list the root), then
    its submodules' paths under it; () when unknown."""
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack") or {}
    entries = [value for value in stack.values()
               if isinstance(value, tuple) and len(value) == 2]
    if not entries:
        return ()
    token = _ROOT_TOKEN.match(str(entries[0][0]))
    root = token.group(0) if token else ""
    root_class = ""
    if root and str(entries[0][0]) == root:
        root_class = getattr(entries[0][1], "__name__", str(entries[0][1]))
        entries = entries[1:]
    out = [("", root_class)]
    for fqn, cls in entries:
        path = module_path(str(fqn), root)
        if path:
            out.append((path, getattr(cls, "__name__", str(cls))))
    return tuple(out)


def source_frames(stack_traces: Iterable[str]) -> Tuple[str, ...]:
    """Dynamo's ``stack_trace`` texts as frames, innermost first, ``file(line): function``."""
    frames: List[str] = []
    for text in stack_traces:
        for path, line, function in reversed(_FRAME.findall(text or "")):
            frame = f"{path}({line}): {function}"
            if frame not in frames:
                frames.append(frame)
        if frames:
            break  # one node's stack: the first that has one
    return tuple(frames[:MAX_SITE_FRAMES])


def site_from_parts(name: str, stacks: Sequence[Tuple[Tuple[str, str], ...]],
                    traces: Iterable[str]) -> Site:
    """One call site as noted in the generated module: its op, its nodes' module stacks
    with how many nodes each (most first), its source frames."""
    counts: Dict[Tuple[Tuple[str, str], ...], int] = {}
    for stack in stacks:
        counts[tuple(stack)] = counts.get(tuple(stack), 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:MAX_SITE_MODULES]
    return (name, tuple((n, stack) for stack, n in ranked), source_frames(traces))


def _origins(node_schedule: Any, is_extern: bool) -> List[Any]:
    if is_extern:
        origin = getattr(node_schedule, "origin_node", None)
        return [origin] if origin is not None else list(getattr(node_schedule, "origins", ()))
    out = []
    for snode in node_schedule:
        node = getattr(snode, "node", None)
        if node is not None:
            out.extend(getattr(node, "origins", ()))
    return out


def _runtime_name(node_schedule: Any, kernel_name: str, is_extern: bool, graph: Any) -> str:
    """The op a call site shows as: the kernel's range, or the extern call's aten op."""
    if not is_extern:
        graph_id = getattr(graph, "graph_id", None)
        return (f"graph_{graph_id}_" if graph_id is not None else "") + kernel_name
    overload = getattr(node_schedule, "op_overload", None)
    schema = getattr(overload, "_schema", None)
    if schema is not None:
        return str(schema.name)
    return kernel_name


def note_site(node_schedule: Any, kernel_name: str, is_extern: bool) -> None:
    """Write one call site into the graph's generated module (never raises)."""
    try:
        from torch._inductor.virtualized import V

        graph = V.graph
        if getattr(graph, "cpp_wrapper", False):
            return
        origins = _origins(node_schedule, is_extern)
        stacks = [module_stack(getattr(o, "meta", {}) or {}) for o in origins]
        traces = [(getattr(o, "meta", {}) or {}).get("stack_trace") or "" for o in origins]
        site = site_from_parts(_runtime_name(node_schedule, kernel_name, is_extern, graph),
                               stacks, traces)
        graph.wrapper_code.header.writeline(SITE_LINE_PREFIX + repr(site) + ")")
    except Exception:  # noqa: BLE001  (never break a compile: the graph stays at graph level)
        return


def wrap_provenance(original: Any) -> Any:
    """Inductor's per-call-site provenance hook, noting the site first."""
    if getattr(original, "_opscope_sites", False):
        return original

    def set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name, is_extern=False):
        note_site(node_schedule, kernel_name, is_extern)
        return original(node_schedule, kernel_name, is_extern)

    set_kernel_post_grad_provenance_tracing._opscope_sites = True  # type: ignore[attr-defined]
    return set_kernel_post_grad_provenance_tracing


def register_graph(graph: Any) -> None:
    """Note a compiled graph under its call range's key (weakly)."""
    key = str(getattr(graph, "_fx_graph_cache_key", None))
    with _lock:
        refs = [r for r in _graphs.get(key, []) if r() is not None and r() is not graph]
        refs.append(weakref.ref(graph))
        _graphs[key] = refs


def parse_sites(source: str) -> Optional[List[Site]]:
    """The sites noted in a generated module's source; None when it has none.

    >>> parse_sites(SITE_LINE_PREFIX + "('aten::mm', (), ()))\\n")
    [('aten::mm', (), ())]
    """
    sites: List[Site] = []
    for line in source.splitlines():
        if line.startswith(SITE_LINE_PREFIX) and line.endswith(")"):
            try:
                sites.append(ast.literal_eval(line[len(SITE_LINE_PREFIX):-1]))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
    return sites or None


def _graph_sites(graph: Any) -> Optional[List[Site]]:
    try:
        if graph in _parsed:
            return _parsed[graph]
    except TypeError:
        return parse_sites(str(getattr(graph, "source_code", "") or ""))
    sites = parse_sites(str(getattr(graph, "source_code", "") or ""))
    try:
        _parsed[graph] = sites
    except TypeError:
        pass
    return sites


def sites_for(names: Iterable[str]) -> Dict[str, List[Optional[List[Site]]]]:
    """Per call-range name in ``names``, the sites of each graph registered under it.

    A graph without sites (compiled before opscope, or by a C++ wrapper) gives None.
    """
    out: Dict[str, List[Optional[List[Site]]]] = {}
    for name in names:
        if not name.startswith(COMPILED_CALL_PREFIX):
            continue
        key = compiled_graph_key(name)
        with _lock:
            graphs = [r() for r in _graphs.get(key, [])]
        out[name] = [_graph_sites(g) for g in graphs if g is not None]
    return out


def compiled_sites(names: Sequence[str], name_ids: Any = ()
                   ) -> Optional[Dict[str, List[Optional[List[Site]]]]]:
    """``sites_for`` the compiled-graph call ranges that a recording's records use
    (``name_ids``: its records' name ids; a collector's name table also holds earlier
    recordings' names); None when it has none (never raises: a failure leaves the graphs
    at graph level). The records are looked at only when the name table has a call range."""
    if not HOOKED[0]:
        return None  # a hook missing (an old torch: said once, at compile_fx's import)
    call_ids = [i for i, name in enumerate(names) if name.startswith(COMPILED_CALL_PREFIX)]
    if not call_ids:
        return None
    ids = np.asarray(name_ids)
    calls = [names[int(i)] for i in distinct(ids[np.isin(ids, call_ids)])]
    if not calls:
        return None
    try:
        return sites_for(calls)
    except Exception:  # noqa: BLE001  (what was recorded is kept, at graph level)
        return None


def compiled_code_ran(names: Sequence[str], name_ids: Any) -> bool:
    """Whether a recording's records (``name_ids``) include a Dynamo frame's region or a
    compiled graph's call: then Dynamo's compiles and breaks are worth keeping, on a torch
    whose graphs stay at graph level too.

    >>> compiled_code_ran(["aten::mm", "Torch-Compiled Region: 0/0"], [0, 1])
    True
    >>> compiled_code_ran(["aten::mm", "Torch-Compiled Region: 0/0"], [0])
    False
    """
    ids = [i for i, name in enumerate(names)
           if name.startswith((COMPILED_FRAME_PREFIX, COMPILED_CALL_PREFIX))]
    return bool(ids) and bool(np.isin(np.asarray(name_ids), ids).any())


def graph_breaks_so_far(limit: int = 100) -> Dict[str, int]:
    """Dynamo's graph breaks so far in this process (reason -> count, the most frequent
    ``limit``), from its own counters; {} when Dynamo is not loaded."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counter = getattr(utils, "counters", {}).get("graph_break") if utils is not None else None
    try:
        items = sorted(dict(counter or {}).items(), key=lambda item: -int(item[1]))
        return {str(reason)[:500]: int(count) for reason, count in items[:limit]}
    except Exception:  # noqa: BLE001  (Dynamo's internals moved: no breaks to show)
        return {}


def compiled_frames_so_far(limit: int = 200) -> Dict[str, Dict[str, Any]]:
    """Dynamo's compiles so far in this process, from its compilation metrics (a bounded
    deque): compile id ("0/1") -> the frame's code (``name``, ``file``, ``line``), its
    ``guards``, the ``recompile_reason`` and the graph breaks it restarted at
    (``break_reasons``); {} when Dynamo is not loaded or its metrics moved.

    ``torch._dynamo.reset()`` numbers frames from 0 again but keeps the metrics: only the
    compiles from the last ``0/0`` on are this numbering's."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    out: Dict[str, Dict[str, Any]] = {}
    try:
        for metric in list(utils.get_compilation_metrics())[-limit:] if utils else ():
            name = getattr(metric, "co_name", None)
            if not name or getattr(metric, "compile_id", None) is None:
                continue  # an entry of the backward's or a runtime's compile: no frame
            if str(metric.compile_id) == "0/0":
                out.clear()  # the first compile after a reset (or of the process)
            reasons = getattr(metric, "restart_reasons", None) or ()
            out[str(metric.compile_id)[:100]] = {
                "name": str(name)[:200], "file": str(metric.co_filename or "")[:500],
                "line": int(metric.co_firstlineno or 0),
                "guards": int(getattr(metric, "guard_count", None) or 0),
                "recompile_reason": str(getattr(metric, "recompile_reason", None) or "")[:500],
                "break_reasons": sorted(str(r)[:500] for r in reasons)[:20]}
    except Exception:  # noqa: BLE001  (Dynamo's internals moved: no frames to show)
        return {}
    return out
