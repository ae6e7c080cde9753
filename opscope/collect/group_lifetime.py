"""Let ``destroy_process_group()`` really end a job's process group, before the script runs.

``torch.distributed.nn.functional`` gives its functions the default argument
``group=group.WORLD``, evaluated when the module is first imported. Imported
after ``init_process_group()`` (``DistributedDataParallel``'s constructor
imports it, through FSDP), those defaults hold the job's default process group
for the rest of the process: ``destroy_process_group()`` then drops torch's
own references but the group lives on, and so do gloo's worker threads. At
interpreter exit a worker that frees a finished collective's tensors asks for
the GIL while Python finalises, and the process aborts with "terminate called
without an active exception" (pytorch #190489), after the script has ended
well.

Imported before any group exists, those defaults are ``None`` (the default
group at call time), and the group ends in ``destroy_process_group()``, with
its threads joined while Python is whole. ``opscope run`` and
``python -m opscope.on_demand`` do that before the script runs
(:func:`import_before_the_group`); a script run any other way can do the same
with ``import torch.distributed.nn`` before ``init_process_group()``.

Example::

    >>> import torch.distributed as dist
    >>> import_before_the_group() == (dist.is_available() and not dist.is_initialized())
    True
"""

from __future__ import annotations

import sys


def import_before_the_group() -> bool:
    """Import ``torch.distributed.nn`` if no default process group exists yet; whether it did.

    Does nothing when torch is not imported, torch.distributed is unavailable,
    or a default group already exists (importing then would pin it). Never
    raises: a torch build whose ``torch.distributed.nn`` fails to import runs
    as before.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        import torch.distributed as dist

        if not dist.is_available() or dist.is_initialized():
            return False
        import torch.distributed.nn  # noqa: F401  -- see the module docstring
    except Exception:  # noqa: BLE001 -- any failure leaves the script as it was
        return False
    return True
