"""Output files, safely: checked once, written atomically, never half there, fork-safe.

The bottom layer of every output opscope writes (traces, stacks, reports,
pages, execution traces): ``output_file(path, where, name)`` checks a
destination at the call (``output_path``), and ``OutputFile.open()`` yields
the stream that replaces it atomically (``atomic``; gzip for ``.gz`` through
``gzip_stream``, compressing on a thread of its own from ``background``).
It imports nothing of opscope above ``opscope.arguments``.

Example::

    >>> import os, tempfile
    >>> out = output_file(os.path.join(tempfile.mkdtemp(), "x.json"), "write_x")
    >>> with out.open(binary=True) as f:
    ...     _ = f.write(b"[]")
    >>> open(out.path).read()
    '[]'
"""

from __future__ import annotations

from opscope.files.atomic import (OutputFile, PathLike, atomic_binary_writer, atomic_text_writer,
                                  output_file)
from opscope.files.output_path import OutputFileError, check_output_path

__all__ = ["OutputFile", "OutputFileError", "PathLike", "atomic_binary_writer",
           "atomic_text_writer", "check_output_path", "output_file"]
