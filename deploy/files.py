"""One atomic file writer for every file a run or an export leaves behind.

A crash, a kill -9 or a full disk at any moment leaves either the old file or the new
one at the path, never a torn one: the content goes to a temporary file in the same
directory (same file system, so the rename is atomic), is flushed to disk, optionally
checked, and only then renamed over the target.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(
    path: str | os.PathLike[str],
    content: bytes | str | Callable[[Path], None],
    *,
    verify: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``content`` to ``path`` atomically and return the path.

    ``content`` is the bytes or text to write, or a function that writes the file at the
    temporary path it is given (``torch.save``, ``h5py``, ``onnx.save`` write by path).
    ``verify(tmp_path)``, if given, runs on the complete temporary file and may raise to
    keep the old file in place (an export loads its file as the robot will first).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        if callable(content):
            os.close(fd)
            content(tmp)
        else:
            data = content.encode() if isinstance(content, str) else content
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
