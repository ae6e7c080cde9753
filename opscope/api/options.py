"""What ``opscope.profile`` checks at construction and writes into a trace's metadata.

The metadata starts at ``start_metadata``. ``distributedInfo`` is filled then
when a process group exists; a script run by ``opscope run`` creates its group
later, so ``complete_distributed_info`` fills it at the first step or stop
that finds one, and at the window's stop falls back to torchrun's environment
(``torchrun_env_info``) when the group is already gone.

Example::

    >>> start_metadata({"record_shapes": True, "with_stack": False}, None, {"run": '"a"'})
    {'record_shapes': '1', 'run': '"a"'}
    >>> torchrun_env_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    {'rank': 1, 'world_size': 2}
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, MutableMapping, Optional

from opscope.configs import CONFIGS_METADATA_KEY
from opscope.model.torch_names import DISTRIBUTED_INFO_KEY

# the variables torchrun (torch.distributed.run) sets in every worker
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def check_optional(name: str, value: Any, cls: type, expected: str) -> Any:
    """``value`` when it is None or a ``cls``; else TypeError naming ``name``.

    >>> check_optional("execution_trace_observer", 3, str, "a str")
    Traceback (most recent call last):
    ...
    TypeError: profile: execution_trace_observer must be a str or None, got int 3
    """
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"profile: {name} must be {expected} or None, got "
                        f"{type(value).__name__} {value!r:.60}")
    return value


def validate_json(key: str, value: str) -> str:
    """``value`` when it is JSON text: bad metadata fails where it is given, not at export."""
    from opscope.export.trace_header import validate_metadata_json

    validate_metadata_json(key, value)
    return value


def start_metadata(options: Mapping[str, bool], configs_metadata: Optional[str],
                   preset: Mapping[str, str]) -> Dict[str, str]:
    """The metadata a recording starts with: the options set, the process group,
    the activity configs opscope does not apply, then the preset entries."""
    metadata = {name: "1" for name, on in options.items() if on}
    dist_info = distributed_info()
    if dist_info:
        metadata[DISTRIBUTED_INFO_KEY] = json.dumps(dist_info)
    if configs_metadata is not None:
        metadata[CONFIGS_METADATA_KEY] = configs_metadata
    metadata.update(preset)
    return metadata


def distributed_info() -> Optional[Dict[str, Any]]:
    """torch.distributed's backend, rank and world size (None when it is not initialised).

    >>> distributed_info() is None
    True
    """
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        info: Dict[str, Any] = {
            "backend": dist.get_backend(),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
        }
        try:
            info["pg_count"] = dist.get_pg_count()
            info["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
        except Exception:
            pass
        return info
    except Exception:
        return None


def torchrun_env_info(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, int]]:
    """``{"rank", "world_size"}`` from torchrun's variables; None outside torchrun.

    Values that are not a rank of the world size count as absent.

    >>> torchrun_env_info({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}) is None
    True
    """
    env = os.environ if environ is None else environ
    try:
        rank, world, local = (int(env[name]) for name in TORCHRUN_ENV)
    except (KeyError, ValueError):
        return None
    if not 0 <= rank < world or local < 0:
        return None
    return {"rank": rank, "world_size": world}


def complete_distributed_info(metadata: MutableMapping[str, str], *, final: bool) -> None:
    """Add ``distributedInfo`` to ``metadata`` when it lacks one and a process group exists.

    With ``final`` (the window stops) and no group, torchrun's rank and world
    size stand in. Costs a dictionary look-up once it is there; never raises.

    >>> meta = {}
    >>> complete_distributed_info(meta, final=True)
    >>> meta
    {}
    """
    if DISTRIBUTED_INFO_KEY in metadata:
        return
    try:
        info: Optional[Dict[str, Any]] = distributed_info()
        if info is None and final:
            info = torchrun_env_info()
        if info is not None:
            metadata[DISTRIBUTED_INFO_KEY] = json.dumps(info)
    except Exception:  # noqa: BLE001  (metadata must never fail the profiled job)
        pass
