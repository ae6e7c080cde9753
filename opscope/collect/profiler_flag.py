"""Tell torch a profiler is on while opscope records, so compiled code emits its ranges.

``torch.compile``'d code adds ranges of its own (``## Call CompiledFxGraph <key> ##``,
``AOTDispatcher Runtime Wrapper Prologue``, ``Pregraph bytecode``, dynamo's compile
phases) only when the module global ``torch.autograd.profiler._is_profiler_enabled``
is True. torch.profiler sets it on enter and clears it on exit (through
``_run_on_profiler_start`` / ``_run_on_profiler_stop``); it is a plain bool that
inductor, AOTAutograd and dynamo read on every call, in torch 2.4 to 2.15. Nothing
in torch reads it to decide whether torch.profiler itself runs: that is C++ state
(``torch._C._autograd._profiler_enabled()``), which this module never changes.

The flag alone is not enough: those ranges are opened with
``torch._C._profiler._RecordFunctionFast``, which records only while torch's own
C++ profiler state exists (a RecordFunction observer like opscope's never sees
them otherwise). Every caller looks the class up on ``torch._C._profiler`` at the
call, so while opscope records it is replaced by ``FastRange``: with torch's
profiler on it is torch's class (torch and opscope both see the range, as
before); else the range is opened on opscope's collector, in the scope torch
would give it (function scope; user scope for ``scope="user_scope"`` when shapes
are recorded), so its key_averages row and trace category are torch's too.

While opscope records, the flag is held True. torch.profiler stopping inside an
opscope recording would clear it, so during the recording torch's
``_run_on_profiler_stop`` is wrapped to set it back. When opscope stops, the flag
goes back to whether torch's own profiler is still running, and torch's class is
put back. Nothing is installed when no opscope profiler runs: the cost then is zero.

Example::

    >>> import torch.autograd.profiler as tap
    >>> from opscope.collect.python.collector import PythonCollector
    >>> hold = ProfilerFlag()
    >>> hold.raise_flag(PythonCollector()); tap._is_profiler_enabled
    True
    >>> hold.lower_flag(); tap._is_profiler_enabled
    False
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_FLAG = "_is_profiler_enabled"
_STOP_HOOK = "_run_on_profiler_stop"
_FAST_CLASS = "_RecordFunctionFast"


def _torch_profiler_module() -> Any:
    """``torch.autograd.profiler``, or None where this torch has no such flag."""
    import torch.autograd.profiler as module

    return module if hasattr(module, _FLAG) else None


def torch_profiler_running() -> bool:
    """Whether torch's own (kineto or legacy) profiler is on, by its C++ state.

    >>> torch_profiler_running()
    False
    """
    import torch

    return bool(torch._C._autograd._profiler_enabled())


def _fast_range_scope(args: tuple, kwargs: dict, record_shapes: bool) -> bool:
    """Whether torch would open this fast range in user scope (else function scope).

    torch reads ``keyword_values`` only when it records input shapes; then
    ``{"scope": "user_scope"}`` (``## Call CompiledFxGraph`` passes it) makes a user range.

    >>> _fast_range_scope((), {"keyword_values": {"scope": "user_scope"}}, True)
    True
    >>> _fast_range_scope((), {"keyword_values": {"scope": "user_scope"}}, False)
    False
    """
    keyword_values = kwargs.get("keyword_values", args[1] if len(args) > 1 else None)
    return bool(record_shapes and isinstance(keyword_values, dict)
                and keyword_values.get("scope") == "user_scope")


def _fast_range_class(original: type, collector: Any, record_shapes: bool) -> type:
    """A stand-in for torch's ``_RecordFunctionFast`` that records on ``collector``."""
    # the native collector opens a range of either scope; the Python one, user ranges only
    scoped = getattr(collector, "name", "") == "native"

    class FastRange:
        """``_RecordFunctionFast(name, input_values=None, keyword_values=None)``."""

        __slots__ = ("_name", "_args", "_kwargs", "_torch_range", "_handle")

        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            if not isinstance(name, str):  # torch's own check, with its message
                raise TypeError("The name passed to RecordFunctionFast must be a string")
            # kept as given: torch's class refuses an explicit None for its optionals
            self._name, self._args, self._kwargs = name, args, kwargs
            self._torch_range: Any = None
            self._handle: Optional[int] = None

        def __enter__(self) -> None:
            if torch_profiler_running():  # torch records it, and opscope's observer sees it
                self._torch_range = original(self._name, *self._args, **self._kwargs)
                self._torch_range.__enter__()
            else:
                if scoped:
                    user = _fast_range_scope(self._args, self._kwargs, record_shapes)
                    self._handle = collector.range_push(self._name, user_scope=user)
                else:
                    self._handle = collector.range_push(self._name)

        def __exit__(self, *exc_info: Any) -> None:
            torch_range, self._torch_range = self._torch_range, None
            handle, self._handle = self._handle, None
            if torch_range is not None:
                torch_range.__exit__(*exc_info)
            elif handle is not None:
                collector.range_pop(handle)

    FastRange.__qualname__ = FastRange.__name__ = _FAST_CLASS
    return FastRange


class ProfilerFlag:
    """Hold torch's "a profiler is on" flag up between ``raise_flag`` and ``lower_flag``."""

    def __init__(self) -> None:
        self._original_stop: Optional[Callable[[], None]] = None
        self._wrapped_stop: Optional[Callable[[], None]] = None
        self._raised = False
        self._original_fast: Optional[type] = None
        self._fast: Optional[type] = None

    @property
    def raised(self) -> bool:
        return self._raised

    def raise_flag(self, collector: Any, record_shapes: bool = False) -> None:
        """Set the flag, keep it set through a torch.profiler stopping inside, and
        open torch's fast ranges on ``collector`` (its ``range_push``/``range_pop``),
        in the scope torch would give them when it ``record_shapes``."""
        module = _torch_profiler_module()
        if module is None or self._raised:
            return
        self._raised = True
        import torch

        original_fast = getattr(torch._C._profiler, _FAST_CLASS, None)
        if isinstance(original_fast, type):
            self._original_fast = original_fast
            self._fast = _fast_range_class(original_fast, collector, record_shapes)
            setattr(torch._C._profiler, _FAST_CLASS, self._fast)
        original = getattr(module, _STOP_HOOK, None)
        if callable(original):
            def stop_and_keep_flag() -> None:
                original()
                if self._raised:  # torch.profiler's exit cleared it; opscope still records
                    setattr(module, _FLAG, True)

            self._original_stop, self._wrapped_stop = original, stop_and_keep_flag
            setattr(module, _STOP_HOOK, stop_and_keep_flag)
        setattr(module, _FLAG, True)

    def lower_flag(self) -> None:
        """Undo ``raise_flag``: the flag again says whether torch.profiler runs."""
        if not self._raised:
            return
        self._raised = False
        module = _torch_profiler_module()
        if module is None:
            return
        original, self._original_stop = self._original_stop, None
        wrapped, self._wrapped_stop = self._wrapped_stop, None
        # one who wrapped it after us keeps their wrapper; ours in it now does nothing
        if original is not None and getattr(module, _STOP_HOOK, None) is wrapped:
            setattr(module, _STOP_HOOK, original)
        original_fast, self._original_fast = self._original_fast, None
        fast, self._fast = self._fast, None
        import torch

        if original_fast is not None and getattr(torch._C._profiler, _FAST_CLASS, None) is fast:
            setattr(torch._C._profiler, _FAST_CLASS, original_fast)
        setattr(module, _FLAG, torch_profiler_running())


# opscope.profile is not reentrant (one records at a time), so one holder serves all
TORCH_FLAG = ProfilerFlag()
