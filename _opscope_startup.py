"""The start-up hook: `OPSCOPE_ON_DEMAND=1 python train.py` for a script that never imports opscope.

``OPSCOPE_BLACKBOX=1`` goes the same way: the import of opscope that follows
torch's starts the black box (``opscope.black_box.environment``).

Installing opscope puts ``opscope-on-demand.pth`` in site-packages; Python runs its
one line (:data:`PTH_LINE`) at every start-up. With ``OPSCOPE_ON_DEMAND`` unset,
empty or 0 that line costs one environment lookup and imports nothing. Set to 1,
it imports this module (standard library only) and calls :func:`install`, which
waits for the program to import torch: when ``import torch`` has finished, it
imports opscope, and that import enables on-demand profiling
(``opscope.on_demand.enable_from_environment``), so ``opscope trigger PID`` works.

Why wait for torch: while .pth files are read, ``sys.path`` is not complete (a
venv's system site-packages, where torch often lives, come later), and a program
that never imports torch has nothing to profile (``pip``, say).

Which processes get an agent, of those that inherit the variable:

- every Python program that imports torch, each worker that ``torchrun`` starts
  included (each has its own pid to trigger);
- not torch's launcher itself (``torchrun``, ``python -m torch.distributed.run``
  or ``.launch``): it trains nothing;
- not multiprocessing's helper processes (spawned or forkserver children, such
  as DataLoader workers): they run no optimizer steps;
- not opscope's own helper processes (the build of the native collector, run
  as a file of the package): enabling there would start that build again;
- a program that imports opscope itself before torch has finished (``opscope
  run``, ``python -m opscope.on_demand``) is enabled once, by that import.

This module lives outside the opscope package because importing anything under
``opscope`` runs ``opscope/__init__.py``, which imports torch.

Example::

    >>> skip_reason(["python", "-m", "torch.distributed.run", "train.py"])
    "torch's launcher (its workers get an agent each)"
    >>> skip_reason(["python", "train.py", "--epochs", "3"]) is None
    True
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: start-up does not pay for importing typing
    from typing import Any, Callable, List, Optional, Sequence, Tuple

ENABLE_ENV = "OPSCOPE_ON_DEMAND"
BLACKBOX_ENV = "OPSCOPE_BLACKBOX"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
PTH_NAME = "opscope-on-demand.pth"
# The .pth file's one line: site.py runs a line that starts with "import". A failure becomes
# one warning line and start-up goes on; it is not retried when the line runs again (a venv
# with a lib64 link reads its site-packages twice).
_PTH_CODE = (
    "import sys\n"
    "if '_opscope_startup' not in sys.modules:\n"
    " try: __import__('_opscope_startup').install()\n"
    " except Exception as e:\n"
    "  sys.modules['_opscope_startup'] = None\n"
    "  sys.stderr.write('opscope: warning: OPSCOPE_ON_DEMAND: '\n"
    "                   'the start-up hook failed: %r\\n' % e)\n"
)
PTH_LINE = ('import os; all(os.environ.get(k, "").strip().lower() in '
            '("", "0", "false", "no", "off") for k in ("OPSCOPE_ON_DEMAND", "OPSCOPE_BLACKBOX")) '
            'or exec(' + repr(_PTH_CODE) + ')')
# the package beside this module (site-packages, or the checkout an editable install points to)
OWN_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opscope")
LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def install() -> bool:
    """Enable on-demand profiling once this program has imported torch, if the environment asks.

    The .pth line calls it; calling it again does nothing more. Returns True
    when the program will be (or, torch being imported already, now is) served.
    """
    global _answer
    if _answer is None:
        _answer = _install()
    return _answer


_answer: Optional[bool] = None


def _install() -> bool:
    value = os.environ.get(ENABLE_ENV, "").strip().lower()
    black_box = os.environ.get(BLACKBOX_ENV, "").strip().lower()
    if value not in ON and black_box not in ON:
        if value not in OFF:
            _warn(f"the value {value!r} is not understood; expected 1 or 0")
        return False
    if skip_reason(getattr(sys, "orig_argv", sys.argv)) is not None:
        return False
    if "torch" in sys.modules:
        start()
    else:
        sys.meta_path.insert(0, AfterTorchImport())
    return True


def skip_reason(argv: Sequence[str]) -> Optional[str]:
    """Why the process that ``argv`` (``sys.orig_argv``) starts gets no agent; None if it gets one.

    >>> skip_reason(["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "2",
    ...              "train.py"])
    "torch's launcher (its workers get an agent each)"
    >>> skip_reason(["python", "-c", "from multiprocessing.spawn import spawn_main; "
    ...              "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"])
    'a multiprocessing helper process (it runs no optimizer steps)'
    """
    kind, target = program(argv)
    if any(_inside(arg, OWN_PACKAGE) for arg in list(argv)[1:]):
        return "one of opscope's own helper processes (the native collector's build)"
    if "--multiprocessing-fork" in argv or (
            kind == "command" and target.lstrip().startswith("from multiprocessing")):
        return "a multiprocessing helper process (it runs no optimizer steps)"
    if (kind == "script" and os.path.basename(target) in LAUNCHER_SCRIPTS) or (
            kind == "module" and target in LAUNCHER_MODULES):
        return "torch's launcher (its workers get an agent each)"
    return None


def _inside(path: str, folder: str) -> bool:
    return os.path.isabs(path) and os.path.normpath(path).startswith(folder + os.sep)


def program(argv: Sequence[str]) -> Tuple[str, str]:
    """What the command line ``argv`` runs: ``("script", path)``, ``("module", name)``,
    ``("command", code)`` or ``("stdin", "")``; the interpreter's own options are skipped.

    >>> program(["python3", "-X", "importtime", "-u", "-m", "torch.distributed.run", "a.py"])
    ('module', 'torch.distributed.run')
    >>> program(["python3", "-Wignore", "-uc", "print(1)"])
    ('command', 'print(1)')
    >>> program(["python3", "-s", "train.py", "-m", "x"])
    ('script', 'train.py')
    """
    args = iter(list(argv)[1:])
    for arg in args:
        if arg == "--check-hash-based-pycs":
            next(args, None)
        elif arg == "--":
            following = next(args, "-")
            return ("stdin", "") if following == "-" else ("script", following)
        elif arg.startswith("--"):
            continue  # --version, --help-env and the like take no value
        elif arg.startswith("-") and arg != "-":
            for at, flag in enumerate(arg[1:], start=2):
                if flag in "cmWX":
                    value = arg[at:] or next(args, "")
                    if flag in "cm":
                        return ("command" if flag == "c" else "module", value)
                    break
        else:
            return ("stdin", "") if arg == "-" else ("script", arg)
    return ("stdin", "")


class AfterTorchImport:
    """A meta path finder that calls :func:`start` when the import of ``torch`` has finished.

    It answers no import itself: for ``torch`` it asks the other finders, and
    wraps the found loader's ``exec_module`` for this one import. Then it
    leaves ``sys.meta_path``.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is not None and callable(getattr(loader, "exec_module", None)):
            try:
                loader.exec_module = _then_start(loader, loader.exec_module)
            except (AttributeError, TypeError) as exc:  # a loader with __slots__, say
                _warn(f"on-demand profiling is not enabled: cannot follow torch's import: {exc}")
        return spec


def _then_start(loader: Any, exec_module: Callable[[Any], None]) -> Callable[[Any], None]:
    """``exec_module``, then :func:`start`; the loader gets its own ``exec_module`` back."""
    own = vars(loader).get("exec_module") if hasattr(loader, "__dict__") else None

    def exec_then_start(module: Any) -> None:
        if getattr(module, "__name__", None) != "torch":  # a loader shared with submodules
            return exec_module(module)
        try:
            exec_module(module)  # torch's own import: its errors are the program's
        finally:
            if own is not None:
                loader.exec_module = own
            else:
                vars(loader).pop("exec_module", None)
        start()

    return exec_then_start


def start() -> None:
    """Import opscope, whose import enables on-demand profiling from the environment.

    Nothing happens when opscope is imported already or being imported (the
    opscope CLI, ``python -m opscope.on_demand``, a script that imports
    opscope): that import enables it, once. A failure is one warning line.
    """
    if "opscope" in sys.modules:
        return
    try:
        import opscope  # noqa: F401  (opscope.on_demand.enable_from_environment runs here)
    except Exception as exc:  # noqa: BLE001  (never break the program's import of torch)
        _warn(f"on-demand profiling is not enabled: importing opscope failed: "
              f"{type(exc).__name__}: {exc}")


def _warn(message: str) -> None:
    if sys.stderr is not None:
        first_line = (message.splitlines() or [""])[0]
        sys.stderr.write(f"opscope: warning: {ENABLE_ENV}: {first_line}\n")


def installed_pth_files() -> List[str]:
    """The ``opscope-on-demand.pth`` files in this interpreter's site-packages folders.

    >>> all(path.endswith(PTH_NAME) for path in installed_pth_files())
    True
    """
    import site

    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [os.path.join(folder, PTH_NAME) for folder in dict.fromkeys(folders)
            if os.path.isfile(os.path.join(folder, PTH_NAME))]
