"""What ``with_modules=True`` records about ``nn.Module`` forward calls.

Each module forward becomes a user range (scope USER) in the event table. The
range's *name* is how the module is identified:

- the outermost module the user called (the *root*) is named by its class:
  ``TransformerEncoder``;
- every module under it by its qualified path from the root, then its class
  in parentheses: ``layers.0.self_attn (MultiheadAttention)``.

``ProfileSession.modules`` maps each such range name to a :class:`ModuleInfo`;
a user range whose name is not a key there is an ordinary user range.
``ProfileSession.module_calls`` holds one :class:`ModuleCall` per forward
call, in call order per thread, with the autograd sequence numbers handed
out during the call (used to attribute backward ops when the collector
records no forward sequence numbers).

In a Chrome trace, a module range is an ``X`` event of category
``user_annotation`` whose args carry ``"Module Class"``, ``"Module Path"``,
``"Module Hierarchy"`` and ``"Module Parameters"``; a loader rebuilds
``ModuleInfo`` from those (see :func:`module_info_from_trace_args`).

A compiled kernel fused from FX nodes of several modules counts for one of them
(``opscope.analysis.compiled_modules``, the majority rule) and names them all: its
*fused modules*, each module's name with its count of nodes (``0.ln (LayerNorm) x10``),
most nodes first, written in a trace as one ``"Fused Modules"`` arg
(:func:`fused_modules_text`).

Example::

    >>> info = ModuleInfo.for_module("layers.0.linear", "Linear", "Model", 4160)
    >>> info.name, info.hierarchy
    ('layers.0.linear (Linear)', 'Model.layers.0.linear')
    >>> ModuleInfo.for_module("", "Model", "Model", 4160).name
    'Model'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

# Keys of a module range's args in the Chrome trace (the marker a loader reads).
TRACE_ARG_CLASS = "Module Class"
TRACE_ARG_PATH = "Module Path"
TRACE_ARG_HIERARCHY = "Module Hierarchy"
TRACE_ARG_PARAMETERS = "Module Parameters"
TRACE_ARG_FUSED = "Fused Modules"  # a fused kernel's modules, on the kernel's event
FUSED_SEPARATOR = "; "


@dataclass(frozen=True)
class ModuleInfo:
    """One module as named in the profile.

    ``path`` is the qualified name under the root (``""`` for the root
    itself), ``hierarchy`` is ``<root class>.<path>`` as the ``Module
    Hierarchy`` trace arg writes it, ``parameters`` counts the elements of the
    module's parameters, its submodules' included.
    """

    name: str
    path: str
    class_name: str
    hierarchy: str
    parameters: int = 0

    @classmethod
    def for_module(cls, path: str, class_name: str, root_class: str,
                   parameters: int = 0) -> "ModuleInfo":
        """The info of the module at ``path`` under a root of class ``root_class``."""
        if not path:
            return cls(class_name, "", class_name, root_class, parameters)
        return cls(f"{path} ({class_name})", path, class_name, f"{root_class}.{path}",
                   parameters)

    def trace_args(self) -> Dict[str, Any]:
        """The args that mark this module's range in a Chrome trace."""
        return {TRACE_ARG_CLASS: self.class_name, TRACE_ARG_PATH: self.path,
                TRACE_ARG_HIERARCHY: self.hierarchy, TRACE_ARG_PARAMETERS: self.parameters}


def module_info_from_trace_args(name: str, args: Dict[str, Any]) -> Optional[ModuleInfo]:
    """The ModuleInfo of a trace event named ``name``, or None if it is no module range.

    >>> module_info_from_trace_args("fc (Linear)", {"Module Class": "Linear",
    ...     "Module Path": "fc", "Module Hierarchy": "Net.fc", "Module Parameters": 6})
    ModuleInfo(name='fc (Linear)', path='fc', class_name='Linear', hierarchy='Net.fc', parameters=6)
    >>> module_info_from_trace_args("step", {"External id": 3}) is None
    True
    """
    if TRACE_ARG_CLASS not in args:
        return None
    return ModuleInfo(name, str(args.get(TRACE_ARG_PATH, "")), str(args[TRACE_ARG_CLASS]),
                      str(args.get(TRACE_ARG_HIERARCHY, name)),
                      int(args.get(TRACE_ARG_PARAMETERS, 0) or 0))


def fused_module_entries(counts: Sequence[Tuple[str, int]]) -> Tuple[str, ...]:
    """A fused kernel's modules, from (module name, FX nodes) pairs: ``name xN`` each.

    >>> fused_module_entries([("0.ln (LayerNorm)", 10), ("0 (Block)", 1)])
    ('0.ln (LayerNorm) x10', '0 (Block) x1')
    """
    return tuple(f"{name} x{int(count)}" for name, count in counts)


def fused_modules_text(entries: Sequence[str]) -> str:
    """The ``"Fused Modules"`` trace arg of a kernel's entries ('' for none).

    >>> text = fused_modules_text(("0.ln (LayerNorm) x10", "0 (Block) x1")); text
    '0.ln (LayerNorm) x10; 0 (Block) x1'
    >>> fused_modules_from_text(text), fused_modules_from_text(7)
    (('0.ln (LayerNorm) x10', '0 (Block) x1'), ())
    """
    return FUSED_SEPARATOR.join(entries)


def fused_modules_from_text(text: Any) -> Tuple[str, ...]:
    """The entries of a ``"Fused Modules"`` trace arg; () for anything but a str."""
    if not isinstance(text, str):
        return ()
    return tuple(entry for entry in text.split(FUSED_SEPARATOR) if entry)


@dataclass
class ModuleCall:
    """One forward call: its range name, OS thread and autograd sequence numbers.

    Autograd nodes created during the call have sequence numbers in
    ``[seq_begin, seq_end)`` on that thread; ``seq_end`` is -1 when the call
    had not returned when recording stopped.
    """

    name: str
    os_tid: int
    seq_begin: int
    seq_end: int = -1
