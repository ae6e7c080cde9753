"""The sources a recording window runs beside its op collector, one probe each.

A probe has ``name``, ``start()``, ``stop() -> {RawSession field: value}``,
``discard()`` (stop keeping nothing; never raises) and ``forget_after_fork()``
(in a forked child: drop what the parent owns). ``Recording`` runs a list of
them, which ``window_probes`` builds from the options and ``activities``:

- ``MemoryProbe`` (``profile_memory``): tensors seen in known roles, for the
  memory categories (``collect.memory_hooks``);
- ``ModuleProbe`` (``with_modules``): one range per ``nn.Module`` forward
  (``collect.module_hooks``);
- ``collect.native.cupti.CuptiProbe`` (``ProfilerActivity.CUDA``): the device side;
- ``ProcessGroupCallsProbe`` (always): the
  process-group calls of the job's Python, their groups, numbers, sizes and call sites.

A ``required`` probe that cannot start fails the window's start, as its option
asked for it; any other is dropped with one warning line and the CPU side goes
on. A later device collector (XPU, MTIA) is one more probe in this list.

Example::

    >>> [p.name for p in window_probes(None, profile_memory=True, with_modules=False,
    ...                                device=False)]
    ['memory', 'process group calls']
"""

from __future__ import annotations

from typing import Any, Dict, List


class _HooksProbe:
    """A probe whose source is hooks: ``_make()`` builds them, ``install()`` and
    ``uninstall()`` set them up and remove them (a half-done install too)."""

    name = ""
    required = True  # its option asked for it: a failed install fails the start

    def __init__(self) -> None:
        self._hooks: Any = None

    def start(self) -> None:
        self._hooks = self._make()
        try:
            self._hooks.install()
        except BaseException:  # a half-done install comes off, required or not
            self._take()
            raise

    def _take(self) -> Any:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.uninstall()
        return hooks

    def stop(self) -> Dict[str, Any]:
        hooks = self._take()
        return {} if hooks is None else self._fields(hooks)

    def discard(self) -> None:
        self._take()

    forget_after_fork = discard


class MemoryProbe(_HooksProbe):
    """``profile_memory``: the roles tensors were seen in (parameters, gradients, ...)."""

    name = "memory"

    def _make(self) -> Any:
        from opscope.collect.memory_hooks import TensorSightings

        return TensorSightings()

    def _fields(self, hooks: Any) -> Dict[str, Any]:
        return {"memory_sightings": hooks.to_array()}


class ModuleProbe(_HooksProbe):
    """``with_modules``: a range per module forward, recorded into the window's collector."""

    name = "modules"

    def __init__(self, collector: Any) -> None:
        super().__init__()
        self._collector = collector

    def _make(self) -> Any:
        from opscope.collect.module_hooks import ModuleRanges

        return ModuleRanges(self._collector)

    def _fields(self, ranges: Any) -> Dict[str, Any]:
        return {"modules": ranges.modules(), "module_calls": ranges.calls(),
                "compiled_module_params": ranges.compiled_module_params()}


class ProcessGroupCallsProbe(_HooksProbe):
    """Always: the process-group calls of the job's Python
    (``collect.job.process_group_calls``)."""

    name = "process group calls"
    required = False

    def _make(self) -> Any:
        from opscope.collect.job.process_group_calls import ProcessGroupCalls

        return ProcessGroupCalls()

    def _fields(self, calls: Any) -> Dict[str, Any]:
        return {"process_group_calls": calls.rows} if calls.rows else {}


def window_probes(collector: Any, *, profile_memory: bool, with_modules: bool,
                  device: bool) -> List[Any]:
    """The probes of a window with these options, in start order."""
    probes: List[Any] = []
    if profile_memory:
        probes.append(MemoryProbe())
    if with_modules:
        probes.append(ModuleProbe(collector))
    if device:
        from opscope.collect.native.cupti import CuptiProbe

        probes.append(CuptiProbe())
    probes.append(ProcessGroupCallsProbe())
    return probes
