"""Reading what a submission's course folder holds after its sandbox has run: every byte of it is input.

The learner's code could write anywhere in its course folder while it ran, so a file there may be a
symbolic link (to an answer key, to a classmate's kept notebook), a folder on its path may be one, and
a "file" may be a FIFO that blocks whoever opens it, or a device, or gigabytes long.
:func:`read_untrusted` reads one such file safely: it walks the path one component at a time from a
directory descriptor that the grader opened itself, with ``O_NOFOLLOW`` on every component, opens the
last one non-blocking, accepts a regular file only and reads at most ``limit`` bytes.  Anything else
raises :class:`UnsafeFile`, whose message says what was found, for the submission's ``status``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["UnsafeFile", "read_untrusted"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(ValueError):
    """A file of a course folder that the grader refuses to read; the message says why."""


def _open_parts(root: Path, relative: Path) -> tuple[int, str]:
    """A descriptor of the folder that holds ``relative`` (walked from ``root`` without following any link),
    and the last component's name."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise ValueError(f"{relative} is not a plain path inside the course folder")
    descriptor = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=descriptor)
            except OSError as error:
                raise _explained(error, Path(*parts[:index + 1]), descriptor, part) from None
            os.close(descriptor)
            descriptor = inner
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor, parts[-1]


def _explained(error: OSError, shown: Path, folder: int, name: str) -> Exception:
    """An OSError met on the way, as UnsafeFile when the entry is not what it should be."""
    try:
        information = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return error   # not there at all: FileNotFoundError, which callers treat as "not written"
    return UnsafeFile(f"{shown} is {_kind(information.st_mode)}, not what the grader wrote there")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def read_untrusted(root: Path, relative: Path | str, limit: int) -> bytes:
    """The bytes of ``root/relative``, a regular file reached without following links, at most ``limit`` long.

    Raises ``FileNotFoundError`` when there is no such entry, :class:`UnsafeFile` when there is one that
    is not a regular file reached through real folders, or that is larger than ``limit``.
    """
    folder, name = _open_parts(Path(root), Path(relative))
    try:
        try:
            descriptor = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=folder)
        except OSError as error:
            raise _explained(error, Path(relative), folder, name) from None
        try:
            mode = os.fstat(descriptor).st_mode
            if not stat.S_ISREG(mode):
                raise UnsafeFile(f"{relative} is {_kind(mode)}, not a regular file")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(descriptor, min(2**20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(descriptor)
    finally:
        os.close(folder)
    if len(data) > limit:
        raise UnsafeFile(f"{relative} is larger than the {limit / 2**20:g} MiB the grader reads")
    return data

