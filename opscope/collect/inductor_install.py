"""Install opscope's notes into Inductor as torch imports it: no flag, no eager import.

``install(after_import)`` (run by ``import opscope``, with
``opscope.torch_import.after_import``) asks, for each Inductor module, to be called
once it is imported: a program that
never compiles never imports Inductor because of opscope. Then:

- ``torch._inductor.config``: ``cpp.enable_kernel_profile`` is turned on, so each
  generated CPU kernel opens a range, unless the user set
  ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE`` themselves or ``OPSCOPE_KERNEL_RANGES=0``;
- ``torch._inductor.debug`` and the codegen modules that imported its provenance hook
  by name: the hook notes each call site (``opscope.collect.inductor_sites``);
- ``torch._inductor.output_code``: ``CompiledFxGraph.post_compile`` registers each
  compiled graph, fresh or from the cache (each call of it opens the range
  ``## Call CompiledFxGraph <key> ##`` while a profiler runs);
- ``torch._dynamo.eval_frame``: opscope's module hooks run in the interpreter, never as
  compiled frames (``opscope.collect.module_hooks.skip_dynamo_frames``);
- ``torch._inductor.compile_fx`` (imported by every compile, after the modules above): if
  this torch lacks one of those hooks (``missing_hooks()``), its graphs stay at graph
  level and opscope says which hook, in one line, once. torch 2.8 has the provenance hook
  in ``torch._inductor.utils``, called only under ``config.trace.enabled``, and no call
  range; torch 2.4 has neither, nor ``output_code`` (COMPAT.md).

Example::

    >>> import os
    >>> kernel_ranges_wanted({"OPSCOPE_KERNEL_RANGES": "0"})
    False
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any, Callable, List, Mapping, Set

from opscope.collect import inductor_sites
from opscope.model.torch_names import COMPILED_CALL_PREFIX

OPT_OUT_ENV = "OPSCOPE_KERNEL_RANGES"
TORCH_FLAG_ENV = "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"
PROVENANCE = "set_kernel_post_grad_provenance_tracing"
# What attribution needs, as the one line names it when missing
HOOKS = {PROVENANCE: f"torch._inductor.debug.{PROVENANCE}",
         "post_compile": "torch._inductor.output_code.CompiledFxGraph.post_compile",
         "call_range": "the '## Call CompiledFxGraph' range in CompiledFxGraph.__call__"}
_CODEGEN_MODULES = ("torch._inductor.codegen.cpp", "torch._inductor.codegen.triton")
_found: Set[str] = set()  # the keys of HOOKS found (and patched) so far
_warned: List[bool] = []


def kernel_ranges_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """False when ``OPSCOPE_KERNEL_RANGES`` is 0/false/no/off, or the user set torch's own
    ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE`` (theirs wins)."""
    if environ.get(OPT_OUT_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return TORCH_FLAG_ENV not in environ


def _config_imported() -> None:
    config = sys.modules.get("torch._inductor.config")
    cpp = getattr(config, "cpp", None)
    if cpp is not None and hasattr(cpp, "enable_kernel_profile") and kernel_ranges_wanted():
        cpp.enable_kernel_profile = True


def _patch_provenance(module_name: str) -> None:
    module = sys.modules.get(module_name)
    original = getattr(module, PROVENANCE, None)
    if callable(original):
        setattr(module, PROVENANCE, inductor_sites.wrap_provenance(original))


def _debug_imported() -> None:
    if callable(getattr(sys.modules.get("torch._inductor.debug"), PROVENANCE, None)):
        _patch_provenance("torch._inductor.debug")
        _found.add(PROVENANCE)


def _opens_call_range(function: Any) -> bool:
    """Whether ``function``'s code (nested code included) spells the call range's name.

    >>> _opens_call_range(lambda key: f"## Call CompiledFxGraph {key} ##")
    True
    >>> _opens_call_range(lambda key: key)
    False
    """
    codes = [getattr(function, "__code__", None)]
    while codes:
        code = codes.pop()
        for const in getattr(code, "co_consts", ()):
            if isinstance(const, str) and const.startswith(COMPILED_CALL_PREFIX):
                return True
            if isinstance(const, types.CodeType):
                codes.append(const)
    return False


def _output_code_imported() -> None:
    module = sys.modules.get("torch._inductor.output_code")
    graph_class = getattr(module, "CompiledFxGraph", None)
    original = getattr(graph_class, "post_compile", None)
    if original is None:
        return
    if _opens_call_range(getattr(graph_class, "__call__", None)):
        _found.add("call_range")
    _found.add("post_compile")
    if getattr(original, "_opscope_sites", False):
        return

    def post_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            inductor_sites.register_graph(self)
        except Exception:  # noqa: BLE001  (never break a compile)
            pass
        return result

    post_compile._opscope_sites = True  # type: ignore[attr-defined]
    post_compile.__doc__ = original.__doc__
    graph_class.post_compile = post_compile


def missing_hooks() -> List[str]:
    """The Inductor hooks that this torch lacks, by name ([] when compiled graphs are
    attributed). Imports Inductor, so that the modules above have been patched."""
    import torch._inductor.compile_fx  # noqa: F401

    return [name for key, name in HOOKS.items() if key not in _found]


def _compile_fx_imported() -> None:
    """Attribution is on when every hook was found; else graph level, said once."""
    missing = missing_hooks()
    inductor_sites.HOOKED[0] = not missing
    if missing and not _warned:
        import warnings

        import torch

        _warned.append(True)
        warnings.warn(f"opscope: torch {torch.__version__}'s Inductor lacks "
                      f"{', '.join(missing)}: torch.compile'd graphs are shown at graph "
                      "level, their kernels without modules or source lines (COMPAT.md)",
                      RuntimeWarning)


def install(after_import: Callable[[str, Callable[[], None]], None]) -> None:
    """Have each Inductor module patched once imported (at once if it already is), through
    ``after_import(module, fn)``; ``compile_fx``, which imports the others, comes last."""
    after_import("torch._inductor.config", _config_imported)
    after_import("torch._inductor.debug", _debug_imported)
    after_import("torch._inductor.output_code", _output_code_imported)
    for name in _CODEGEN_MODULES:
        after_import(name, lambda name=name: _patch_provenance(name))
    after_import("torch._dynamo.eval_frame", _dynamo_imported)
    after_import("torch._inductor.compile_fx", _compile_fx_imported)


def _dynamo_imported() -> None:
    """opscope's module hooks are never compiled as Dynamo frames of their own."""
    from opscope.collect.module_hooks import skip_dynamo_frames

    skip_dynamo_frames()
