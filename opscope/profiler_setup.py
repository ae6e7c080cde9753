"""What ``opscope.profile`` checks at construction and writes into a trace's metadata at start.

Example::

    >>> start_metadata({"record_shapes": True, "with_stack": False}, None, {"run": '"a"'})
    {'record_shapes': '1', 'run': '"a"'}
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

from opscope.configs import CONFIGS_METADATA_KEY


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
        metadata["distributedInfo"] = json.dumps(dist_info)
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
