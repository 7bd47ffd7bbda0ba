"""File writes that never leave a half-written or silently replaced file behind."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str, *, overwrite: bool = True) -> Path:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename.

    A reader sees the old file or the new one, never a partial one. With ``overwrite=False`` an
    existing file (or link) is left alone and ``FileExistsError`` is raised. A file replaced keeps its
    permissions, one through a symlink is written where the link points, and a read-only one is
    refused (``PermissionError``); a new file gets the umask's permissions, as ``open`` would give it.
    """
    path = Path(path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(str(path))
    if overwrite and path.is_symlink():
        try:
            path = path.resolve()  # the link stays; the file it points to gets the text
        except RuntimeError:  # a loop of links (Python 3.11 raises this, later ones OSError)
            raise OSError(errno.ELOOP, "the symbolic links form a loop", str(path)) from None
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            # link() fails if the name was taken meanwhile: no race with a concurrent writer.
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _mode_for(path: Path) -> int:
    try:
        current = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
    if not current & 0o222:
        raise PermissionError(errno.EACCES, "the file is read-only (make it writable to replace it)", str(path))
    return current


def first_free_name(folder: Path, stem: str, suffix: str) -> Path:
    """``stem.suffix`` if free, else ``stem.1.suffix``, ``stem.2.suffix`` ...: never a clobber."""
    candidate = folder / f"{stem}{suffix}"
    n = 0
    while candidate.exists():
        n += 1
        candidate = folder / f"{stem}.{n}{suffix}"
    return candidate
