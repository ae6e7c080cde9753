"""Live ``nn.Module`` hooks for ``with_modules=True``: each forward call is a range.

``ModuleRanges(collector).install()`` registers one global forward pre-hook
and one global forward hook (``always_call=True``, so a forward that raises
still closes its range). Every ``nn.Module.__call__`` then opens a user range
through ``collector.range_push`` (the same path as ``record_function``, so the
native and the Python collector both record it) and closes it on return.
``uninstall()`` removes both hooks; a range still open then ends when the
collector stops.

Naming (see ``opscope.model.modules``): a module called while no other module
runs on its thread is a *root*, named by its class; a module called inside a
root is named by its qualified path under that root plus its class, e.g.
``encoder.layers.0.self_attn (MultiheadAttention)``. A module that is not a
submodule of the running root (built on the fly, or borrowed from another
model) is named ``<caller path>.<Class>``.

Example::

    >>> import torch
    >>> from opscope.collect.python.collector import PythonCollector
    >>> collector = PythonCollector()
    >>> collector.start()
    >>> hooks = ModuleRanges(collector)
    >>> hooks.install()
    >>> _ = torch.nn.Sequential(torch.nn.Linear(2, 2))(torch.ones(1, 2))
    >>> hooks.uninstall(); raw = collector.stop()
    >>> sorted(hooks.modules())
    ['0 (Linear)', 'Sequential']
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.modules import module as nn_module

from opscope.model.modules import ModuleCall, ModuleInfo

# Set on our hook functions so tests can tell them from anyone else's.
HOOK_MARKER = "_opscope_module_hook"
# torch.compile'd modules warn on every call while any global module hook is set; our
# hooks handle them (one range named as the compiled module), so the warning is noise.
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def _compiled_original(module) -> Optional[Any]:
    """The module a ``torch.compile``'d module wraps (``OptimizedModule._orig_mod``), or None."""
    original = getattr(module, "_orig_mod", None)
    if original is None or not isinstance(original, torch.nn.Module):
        return None
    return original if type(module).__name__ == "OptimizedModule" else None


def _sequence_nr() -> int:
    """The autograd sequence number the next node on this thread will get (-1 if unknown)."""
    peek = getattr(torch._C._autograd, "_get_sequence_nr", None)
    return int(peek()) if peek is not None else -1


def installed_hooks() -> List[Any]:
    """opscope module hooks currently registered with torch (empty when none is)."""
    tables = [getattr(nn_module, name, {}) for name in
              ("_global_forward_pre_hooks", "_global_forward_hooks")]
    return [hook for table in tables for hook in table.values()
            if getattr(hook, HOOK_MARKER, False)]


class _Frame:
    """One open module call on a thread's stack."""

    __slots__ = ("module", "info", "handle", "call")

    def __init__(self, module, info: ModuleInfo, handle: Any, call: ModuleCall):
        self.module = module
        self.info = info
        self.handle = handle
        self.call = call


class ModuleRanges:
    """Turns every ``nn.Module`` forward into a named range while installed."""

    def __init__(self, collector: Any):
        self._collector = collector
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles: List[Any] = []
        self._modules: Dict[str, ModuleInfo] = {}
        self._calls: List[ModuleCall] = []
        # id(root) -> (root, {id(submodule): qualified path}) and id(module) ->
        # (module, parameter count): holding the objects keeps their ids unique.
        self._paths: Dict[int, Tuple[Any, Dict[int, str]]] = {}
        self._params: Dict[int, Tuple[Any, int]] = {}
        # a torch.compile'd module's inner modules (their calls run inside its graphs, where
        # no hook records them): range name -> parameter count (compiled_module_params)
        self._inner_params: Dict[str, int] = {}
        self._roots_seen: Dict[int, Any] = {}

    # -- install / uninstall ------------------------------------------------
    def install(self) -> None:
        """Register the global forward pre-hook and forward hook."""
        try:
            self._handles.append(nn_module.register_module_forward_pre_hook(self._pre_hook))
            self._handles.append(nn_module.register_module_forward_hook(
                self._post_hook, always_call=True))
            warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
            self._warning_filter = warnings.filters[0]
        except BaseException:
            self.uninstall()
            raise

    def uninstall(self) -> None:
        """Remove both hooks and our warning filter (idempotent); forget the roots they saw."""
        while self._handles:
            self._handles.pop().remove()
        entry, self._warning_filter = getattr(self, "_warning_filter", None), None
        if entry is not None and entry in warnings.filters:
            warnings.filters.remove(entry)
            warnings._filters_mutated()  # type: ignore[attr-defined]
        self._paths.clear()
        self._params.clear()
        self._roots_seen.clear()

    # -- results ------------------------------------------------------------
    def modules(self) -> Dict[str, ModuleInfo]:
        """Range name -> ModuleInfo, for every module called while installed."""
        with self._lock:
            return dict(self._modules)

    def calls(self) -> List[ModuleCall]:
        """Every forward call, in start order per thread."""
        with self._lock:
            return list(self._calls)

    # -- hooks ----------------------------------------------------------------
    def _stack(self) -> List[_Frame]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre_hook(self, module, args) -> None:
        if _is_compiling():  # traced by torch.compile: record nothing, change no graph
            return
        stack = self._stack()
        if stack and _compiled_original(stack[-1].module) is module:
            return  # the compiled module's own module: its range is already open
        original = _compiled_original(module)
        info = self._info(original or module, stack)
        call = ModuleCall(info.name, threading.get_native_id(), _sequence_nr())
        with self._lock:
            self._modules.setdefault(info.name, info)
            self._calls.append(call)
        if original is not None and self._roots_seen.get(id(original)) is not original:
            self._note_inner_modules(original, info)
        handle = self._collector.range_push(info.name)
        stack.append(_Frame(module, info, handle, call))

    def _post_hook(self, module, args, output) -> None:
        if _is_compiling():
            return
        stack = self._stack()
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth].module is module:
                break
        else:
            return  # its pre-hook ran before we were installed
        seq = _sequence_nr()
        while len(stack) > depth:  # close calls left open by an exception, innermost first
            frame = stack.pop()
            frame.call.seq_end = seq
            self._collector.range_pop(frame.handle)

    # -- naming ---------------------------------------------------------------
    def _info(self, module, stack: List[_Frame]) -> ModuleInfo:
        class_name = type(module).__name__
        if not stack:
            return ModuleInfo.for_module("", class_name, class_name, self._param_count(module))
        root = stack[0].module
        entry = self._paths.get(id(root))
        if entry is None or entry[0] is not root:
            entry = (root, {id(m): path for path, m in root.named_modules()})
            self._paths[id(root)] = entry
        path = entry[1].get(id(module))
        if path is None:  # not a submodule of the root: name it under its caller
            caller = stack[-1].info.path
            path = f"{caller}.{class_name}" if caller else class_name
        return ModuleInfo.for_module(path, class_name, stack[0].info.class_name,
                                     self._param_count(module))

    def _note_inner_modules(self, root, info: ModuleInfo) -> None:
        """Parameter counts of a compiled module's inner modules, named as
        ``analysis.compiled_modules`` names their ranges (once per module object)."""
        self._roots_seen[id(root)] = root
        counts = {}
        for path, sub in root.named_modules():
            if path:
                full = f"{info.path}.{path}" if info.path else path
                counts[ModuleInfo.for_module(full, type(sub).__name__, "").name] = \
                    self._param_count(sub)
        with self._lock:
            self._inner_params.update(counts)

    def compiled_module_params(self) -> Dict[str, int]:
        """Range name -> parameters of each inner module of a compiled module called."""
        with self._lock:
            return dict(self._inner_params)

    def _param_count(self, module) -> int:
        entry = self._params.get(id(module))
        if entry is None or entry[0] is not module:
            entry = (module, sum(int(p.numel()) for p in module.parameters()))
            self._params[id(module)] = entry
        return entry[1]


setattr(ModuleRanges._pre_hook, HOOK_MARKER, True)
setattr(ModuleRanges._post_hook, HOOK_MARKER, True)


DYNAMO_EVAL_FRAME = "torch._dynamo.eval_frame"


def skip_dynamo_frames() -> None:
    """Dynamo never compiles the hooks, nor what they call, as frames of their own.

    Eager module calls after a graph break run under Dynamo's frame callback, which
    compiled each hook into a frame with no graph (a ``TorchDynamo Cache Lookup`` on every
    call after that). The hooks' code is marked to run in the interpreter, callees too;
    inside a graph they are traced as before (and record nothing there: ``_is_compiling``).
    A torch with ``skip_code`` only (2.4, 2.8) skips one frame, not its callees: there every
    function and method of this module is skipped (2.4 compiled ``_compiled_original``);
    one without it keeps the old behaviour. ``import opscope`` calls it once Dynamo is
    imported (``opscope.collect.inductor_install``).
    """
    eval_frame = sys.modules.get(DYNAMO_EVAL_FRAME)
    strategy = getattr(eval_frame, "FrameExecStrategy", None)
    action = getattr(eval_frame, "FrameAction", None)
    skip = getattr(eval_frame, "skip_code", None)
    if strategy is not None and hasattr(action, "SKIP"):
        for hook in (ModuleRanges._pre_hook, ModuleRanges._post_hook):
            eval_frame.set_code_exec_strategy(hook.__code__,
                                              strategy(action.SKIP, action.SKIP))
    elif skip is not None:
        for code in _own_code():
            skip(code)


def _own_code() -> List[Any]:
    """The code of each function and method defined in this module (what the hooks call).

    >>> ModuleRanges._pre_hook.__code__ in _own_code()
    True
    """
    functions = []
    for value in list(globals().values()):
        if isinstance(value, type) and value.__module__ == __name__:
            functions.extend(vars(value).values())
        else:
            functions.append(value)
    return [f.__code__ for f in functions
            if getattr(f, "__module__", None) == __name__ and hasattr(f, "__code__")]
