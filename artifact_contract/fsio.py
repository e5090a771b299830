"""Durable file writes shared by ``training`` and ``service``.

Every file either package writes for another process to read (manifests, the
active-model pointer, index snapshots, checkpoints, exported graphs) goes
through these helpers, so a crash leaves either the old file or the new one,
never a torn one: write a temporary file in the same directory, ``fsync`` it,
``os.replace`` it over the target, then ``fsync`` the directory so the rename
itself survives a power loss (POSIX gives no durability for a rename until the
directory entry is flushed).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike) -> None:
    """``fsync`` a directory so a rename or create inside it is durable.

    Raises:
        OSError: the directory cannot be opened (missing, permissions).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace(src, dst)`` then ``fsync`` the destination's directory.

    For files or directories a library wrote itself (an ONNX graph, a FAISS
    snapshot, a checkpoint directory) next to ``dst``. ``src`` must be on the
    same filesystem as ``dst``; its contents must already be flushed.
    """
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically and durably; returns ``path``.

    The parent directory is created if missing. ``mode`` is applied before the
    rename (``mkstemp`` creates files 0600). On any error the temporary file is
    removed and the previous content of ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        replace_durably(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, mode: int = 0o644) -> Path:
    """JSON version of :func:`atomic_write_bytes` (``obj`` must be JSON-serialisable)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent), mode=mode)
