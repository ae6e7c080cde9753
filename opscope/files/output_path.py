"""Where an output file really goes, and errors that name the path the user gave.

``check_output_path`` checks an output path once, at the call (type, emptiness,
a folder, a missing parent folder), so a bad argument fails before any work.
``resolve_output`` decides how to write it, without ever replacing a node that
is not a regular file:

- a regular file or nothing: written atomically in its own folder;
- a symlink: its final target is written the same way, in the target's
  folder (a dangling link's target is created); a link that another user
  planted in a shared sticky folder such as /tmp is refused, as the kernel's
  ``fs.protected_symlinks`` does;
- a FIFO or a character device (``/dev/null``): written through, in place;
- a block device, socket or other node: refused.

Errors are ``OutputFileError`` (an ``OSError`` of the original errno class)
whose ``filename`` is the user's path and whose text reads
``cannot write 'PATH': REASON``; a hidden temp file is never named.

Example::

    >>> err = output_error(OSError(28, "No space left on device"), "out/trace.json")
    >>> str(err), err.errno, err.filename
    ("cannot write 'out/trace.json': No space left on device", 28, 'out/trace.json')
    >>> resolve_output("/dev/null").kind
    'device'
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Type

from opscope.arguments import check_path

_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


class OutputFileError(OSError):
    """An OSError while writing an output file; ``str()`` names the user's path."""

    where: Optional[str] = None  # the function, when the error comes from an argument check

    def __str__(self) -> str:
        text = f"cannot write {self.filename!r}: {self.strerror}"
        return f"{self.where}: {text}" if self.where else text

    def __reduce__(self):  # the classes are made at run time: pickle by recipe
        base = next(c for c in type(self).__mro__ if c.__module__ == "builtins"
                    and issubclass(c, OSError) and not issubclass(c, OutputFileError))
        return _rebuild, (self.errno, self.strerror, self.filename, base.__name__, self.where)


def _rebuild(code: Optional[int], reason: str, path: str, base_name: str,
             where: Optional[str] = None) -> OSError:
    import builtins

    error = _error_class(code, getattr(builtins, base_name, OSError))(code, reason, path)
    error.where = where
    return error


_ERROR_CLASSES: Dict[Type[OSError], Type[OutputFileError]] = {}


def _error_class(code: Optional[int], base: Type[OSError] = OSError) -> Type[OutputFileError]:
    """An OutputFileError that is also the OSError subclass ``code`` maps to (or ``base``)."""
    if code is not None:
        base = type(OSError(code, ""))
    if not issubclass(base, OSError) or base.__module__ != "builtins":
        base = OSError
    if base not in _ERROR_CLASSES:
        # shown as the builtin name in tracebacks: "PermissionError: cannot write ..."
        _ERROR_CLASSES[base] = type(base.__name__, (OutputFileError, base),
                                    {"__module__": "builtins", "__doc__": base.__doc__})
    return _ERROR_CLASSES[base]


def output_error(exc: BaseException, path: str) -> OSError:
    """``exc`` (an OSError) as an OutputFileError naming ``path``; others as they are.

    >>> isinstance(output_error(PermissionError(13, "Permission denied"), "t.json"),
    ...            PermissionError)
    True
    """
    if isinstance(exc, OutputFileError) or not isinstance(exc, OSError):
        return exc  # type: ignore[return-value]
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return _error_class(exc.errno, type(exc))(exc.errno, reason, path)


def new_error(code: Optional[int], reason: str, path: str,
              where: Optional[str] = None) -> OutputFileError:
    """An OutputFileError of errno ``code`` reading ``[where: ]cannot write 'path': reason``."""
    error = _error_class(code)(code, reason, path)
    error.where = where
    return error


def check_output_path(where: Optional[str], name: str, value: Any) -> str:
    """``value`` as a str output path, checked once: its type, itself, its folder.

    With ``where`` (the function called): TypeError or ValueError (from
    ``opscope.arguments.check_path``) for a non-path or ``''``, and errors that
    begin ``where: ``. IsADirectoryError for a folder (or, with ``where``, a
    path ending in a separator); FileNotFoundError naming the folder when it
    does not exist.

    >>> check_output_path("export_chrome_trace", "path", "/")
    Traceback (most recent call last):
    ...
    IsADirectoryError: export_chrome_trace: path '/' is a folder; expected a file path
    >>> check_output_path("export_chrome_trace", "path", "/no/such/folder/trace.json")
    Traceback (most recent call last):
    ...
    FileNotFoundError: export_chrome_trace: cannot write '/no/such/folder/trace.json': the folder '/no/such/folder' does not exist
    >>> check_output_path(None, "path", "/no/such/folder/t.json")
    Traceback (most recent call last):
    ...
    FileNotFoundError: cannot write '/no/such/folder/t.json': the folder '/no/such/folder' does not exist
    """
    path = os.fspath(value) if where is None else check_path(where, name, value)
    if os.path.isdir(path) or (where is not None and path.endswith(os.sep)):
        if where is None:
            raise new_error(errno.EISDIR, "it is a folder, expected a file path", path)
        raise IsADirectoryError(f"{where}: {name} {path!r} is a folder; expected a file path")
    problem = folder_problem(os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        raise new_error(*problem, path, where=where)
    return path


def folder_problem(folder: str) -> Optional[Tuple[int, str]]:
    """(errno, reason) when files cannot be made in ``folder`` because of the folder itself.

    >>> folder_problem("/no/such")
    (2, "the folder '/no/such' does not exist")
    >>> folder_problem("/") is None
    True
    """
    try:
        info = os.stat(folder)
    except FileNotFoundError:
        return errno.ENOENT, f"the folder {folder!r} does not exist"
    except NotADirectoryError:
        return errno.ENOTDIR, f"a part of the folder {folder!r} is not a folder"
    except PermissionError:
        return errno.EACCES, f"Permission denied (cannot reach the folder {folder!r})"
    except OSError as exc:
        return exc.errno or errno.EIO, f"{exc.strerror or exc} (folder {folder!r})"
    if not stat.S_ISDIR(info.st_mode):
        return errno.ENOTDIR, f"{folder!r} is not a folder"
    return None


@dataclass(frozen=True)
class OutputTarget:
    """How to write one output path.

    ``kind`` is ``"file"`` (write a temp file in ``folder`` and rename it to
    ``name``; ``existing`` is the stat of the file it replaces, if any) or
    ``"device"`` (a FIFO or character device at ``target``: write in place).
    ``shown`` is the path the user gave, for errors.
    """

    kind: str
    shown: str
    target: str
    folder: str
    name: str
    existing: Optional[os.stat_result]


def resolve_output(path: str) -> OutputTarget:
    """Follow ``path``'s symlinks (trusted ones only) and decide how to write it.

    ``path`` is one ``check_output_path`` passed: its own folder is not checked
    again, a link's is. Raises OutputFileError naming ``path`` for a folder, a
    link into a missing folder, a block device or socket, a symlink loop or an
    untrusted symlink.
    """
    shown = path
    current = os.path.abspath(path)
    for hop in range(_MAX_LINKS):
        folder, name = os.path.split(current)
        folder = os.path.realpath(folder)
        current = os.path.join(folder, name)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            problem = folder_problem(folder) if hop else None
            if problem is not None:
                raise new_error(*problem, shown) from None
            return OutputTarget("file", shown, current, folder, name, None)
        except OSError as exc:
            raise output_error(exc, shown) from None
        if not stat.S_ISLNK(info.st_mode):
            return _target_for(shown, current, folder, name, info)
        _check_link_trusted(shown, current, info, folder)
        link = os.readlink(current)
        following = os.path.join(folder, link)
        if not os.path.lexists(following) and os.path.exists(current):
            # a /proc "magic" link (pipe:[123], a deleted file): only its own path opens it
            info = os.stat(current)
            if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode) \
                    or stat.S_ISSOCK(info.st_mode):
                return _target_for(shown, current, folder, name, info)
            raise new_error(errno.EINVAL, f"it links to {link!r}, which is not a file path",
                            shown)
        current = following
    raise new_error(errno.ELOOP, "too many levels of symbolic links", shown)


def _target_for(shown: str, current: str, folder: str, name: str,
                info: os.stat_result) -> OutputTarget:
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return OutputTarget("file", shown, current, folder, name, info)
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return OutputTarget("device", shown, current, folder, name, info)
    if stat.S_ISDIR(mode):
        raise new_error(errno.EISDIR, "it is a folder, expected a file path", shown)
    kinds = ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    what = next((text for test, text in kinds if test(mode)), "not a regular file")
    where = "" if current == os.path.abspath(shown) else f" ({current!r})"
    raise new_error(errno.EINVAL, f"it is {what}{where}; opscope writes only regular "
                                  f"files, FIFOs and character devices", shown)


def _check_link_trusted(shown: str, link: str, info: os.stat_result, folder: str) -> None:
    """Refuse a symlink owned by someone else in a sticky, world-writable folder.

    In such a folder (/tmp) any user can plant a link; following it would let
    them choose which file we overwrite. The link's owner and the folder's
    owner are trusted, as with the kernel's ``fs.protected_symlinks``.
    """
    if not hasattr(os, "geteuid"):
        return
    folder_info = os.stat(folder)
    shared = folder_info.st_mode & stat.S_ISVTX and folder_info.st_mode & stat.S_IWOTH
    if shared and info.st_uid not in (os.geteuid(), folder_info.st_uid):
        raise new_error(errno.EACCES, f"it is a symlink ({link!r}) owned by uid "
                                      f"{info.st_uid} in the shared folder {folder!r}; "
                                      f"opscope does not follow another user's link there",
                        shown)
