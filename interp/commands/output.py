"""Where the CLI writes: output paths checked before any work, results written whole or not at all, one
writer per result at a time.

- :func:`check_output_file` / :func:`check_output_folder`: before torch is imported, refuse an output that
  cannot be written (an existing file or folder in the way, a path under a regular file, a read-only folder).
- :func:`atomic_file`: one output file (a patch) written to a temporary name and renamed into place.
- :func:`atomic_output_dir`: a context manager for one result in a folder (a study's ``<study>.json`` and its
  figures, or a whole report). It takes the result's lock (``<folder>/<marker>.lock``, the cache's
  :class:`~interp.cache.lock.WriterLock`), yields an empty staging folder inside ``out`` to write into, and on
  success moves the staged files into ``out`` (renames only, the marker last) and removes the old result's files
  that were not written again. On any failure (a full disk, Ctrl-C, an error) the staging folder is removed and
  the old result is left as it was. A staging folder left by a killed run is removed by the next run.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

from ..errors import OutputError, OutputPathError
from ..paths import special_kind

STAGING_PREFIX = ".interp-staging-"  # staging and backup folders inside an output folder (hidden, ours)
_SHOWN: Dict[Path, Path] = {}  # active staging folder -> the output folder it stands for (for messages)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def ours(name: str) -> bool:
    """Whether an entry of an output folder is interp's bookkeeping (staging folder, lock file), not a result."""
    return name.startswith(STAGING_PREFIX) or name.endswith(".lock")


def shown(path) -> Path:
    """``path`` as the user should read it: a path in an active staging folder is named in its output folder."""
    path = Path(path)
    for staging, out in _SHOWN.items():
        if path == staging or staging in path.parents:
            return out / path.relative_to(staging)
    return path


# ------------------------------------------------------------------------------------------ before any work
def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable(folder: Path, flag: str, given) -> None:
    """Create and remove a probe file in ``folder``: the one check that also sees read-only mounts as root."""
    probe = folder / f"{STAGING_PREFIX}probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        if e.errno in _NOT_WRITABLE:
            raise OutputError(f"{flag} {str(given)!r}: cannot write in {str(folder)!r} ({e.strerror}); "
                              "choose a writable location") from None
        if e.errno in _NO_SPACE:
            raise OutputError(f"{flag} {str(given)!r}: no space left on the device of {str(folder)!r}; "
                              "free some space or choose another location") from None
        raise OutputPathError(f"{flag} {str(given)!r}: cannot create a file in {str(folder)!r} ({e.strerror}); "
                              "choose a folder on an ordinary writable disk") from None  # /proc, /sys: a bad path


def _check_ancestor(path: Path, flag: str) -> Path:
    """The nearest existing folder at or above ``path``; refuses a path under a regular file."""
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {str(path)!r} lies under {str(base)!r}, which is a file, not a folder; "
                          "choose a path outside it")
    return base


def refuse_special(path, flag: str = "--out") -> None:
    """Refuse (one line, exit status 2) an output path that is a device node, FIFO, socket or a symlink to one:
    interp replaces only regular files and folders of its own, even with ``--overwrite``."""
    kind = special_kind(path)
    if kind:
        where = f"{flag} {str(path)!r}" if flag else repr(str(path))
        raise OutputPathError(f"{where} is {kind}, not a regular file or folder; interp never "
                              "replaces it (not even with --overwrite): choose another path")


def check_output_folder(path, flag: str = "--out") -> None:
    """Before any work: ``path`` is a folder that exists or can be created, and is writable (a device node, FIFO
    or socket in its place is refused)."""
    path = Path(path)
    refuse_special(path, flag)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {str(path)!r} is a file; give a folder (it is created if missing)")
    _check_writable(_check_ancestor(path, flag), flag, path)


def check_output_file(path, flag: str = "--out", overwrite: bool = False, resume: bool = False,
                      example: str = "out.h5", hint: str = "pass --overwrite to replace it or choose another path"
                      ) -> None:
    """Before any work: ``path`` is a file path whose folder is writable; an existing file is refused unless
    ``overwrite`` (or ``resume``, which continues it); a device node, FIFO, socket or a symlink to one is
    refused even then."""
    path = Path(path)
    refuse_special(path, flag)
    if path.is_dir():
        raise OutputPathError(f"{flag} {str(path)!r} is a folder; give a file path, e.g. {str(path / example)!r}")
    if path.exists() and not (overwrite or resume):
        raise OutputError(f"{flag} {str(path)!r} already exists; {hint}")
    _check_writable(_check_ancestor(path.parent, flag), flag, path)


# ------------------------------------------------------------------------------------------ while writing
def output_error(e: OSError, out: Path, what: str) -> Optional[OutputError]:
    """The one-line error for an OSError met while writing ``what`` into ``out`` (None: not about the output)."""
    name = getattr(e, "filename", None)
    about_out = name is not None and (Path(os.path.abspath(name)) == out
                                      or out in Path(os.path.abspath(name)).parents)
    unchanged = f"{str(out)!r} is unchanged"
    if e.errno in _NO_SPACE:
        return OutputError(f"no space left on the device while writing the {what} into {str(out)!r}; "
                           f"{unchanged}: free some space or choose another --out")
    if e.errno in _NOT_WRITABLE and (about_out or name is None):
        return OutputError(f"cannot write the {what} into {str(out)!r} ({e.strerror}); {unchanged}: "
                           "choose a writable --out")
    if e.errno == errno.EFBIG:
        return OutputError(f"a file of the {what} is larger than this system allows (the file size limit, "
                           f"`ulimit -f`, or the file system's) while writing into {str(out)!r}; {unchanged}: "
                           "raise the limit or choose another --out")
    if e.errno == errno.ENOTDIR and about_out:
        return OutputError(f"--out {str(out)!r} lies under a file, not a folder; choose a path outside it")
    return None


def _write_errno(e: BaseException, tmp: Path) -> Optional[int]:
    """The errno behind a failed write: an OSError's own, the "os error N" a Rust writer (safetensors) quotes, or
    EFBIG when ``tmp`` reached the file size limit (torch.save says only "unexpected pos")."""
    if isinstance(e, OSError) and e.errno:
        return e.errno
    quoted = re.search(r"os error (\d+)", str(e))
    if quoted:
        return int(quoted.group(1))
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and os.path.exists(tmp) and os.path.getsize(tmp) >= limit:
        return errno.EFBIG
    return None


@contextmanager
def atomic_file(path, what: str = "file") -> Iterator[Path]:
    """Write one output file whole or not at all: yields a temporary path beside ``path`` to write, renamed onto
    ``path`` on success; on failure it is removed (an existing ``path`` stays as it was) and a full disk, a file
    size limit or a read-only folder is one :class:`OutputError` line."""
    path = Path(os.path.abspath(path))
    tmp = path.with_name(f"{STAGING_PREFIX}{os.getpid()}-{path.name}")  # same suffix: writers choose by it
    refuse_special(path)
    try:
        yield tmp
        refuse_special(path)  # checked again: the path may have changed while the file was written
        os.replace(tmp, path)
    except Exception as e:
        code = _write_errno(e, tmp)
        tmp.unlink(missing_ok=True)
        error = output_error(OSError(code, os.strerror(code), str(tmp)), path, what) if code else None
        if error is None:
            raise
        raise error from None


def _stale(out: Path, stem: str) -> Iterator[Path]:
    pattern = re.compile(re.escape(STAGING_PREFIX + stem) + r"(-old)?-\d+")
    for entry in out.iterdir():
        if pattern.fullmatch(entry.name):
            yield entry


def _clean_stale(out: Path, stem: str, marker: str) -> None:
    """Remove what a killed run of this result left (we hold its lock). A backup of the old result left by a run
    killed inside ``_commit`` before its marker was placed is moved back first, so the old result survives."""
    for entry in _stale(out, stem):
        if entry.name.startswith(f"{STAGING_PREFIX}{stem}-old-") and not os.path.lexists(out / marker):
            for old in entry.iterdir():
                os.replace(old, out / old.name)
        shutil.rmtree(entry, ignore_errors=True)


def _commit(staging: Path, out: Path, marker: str, replaces: Sequence[str], backup: Path) -> None:
    """Move the staged entries into ``out`` (marker last) and drop the old result's entries not written again.

    Only renames: the old entries go to ``backup`` first, so a failure puts them back."""
    new = sorted(p.name for p in staging.iterdir())
    order = [n for n in new if n != marker] + ([marker] if marker in new else [])
    gone = [Path(n).name for n in replaces if Path(n).name not in new and not ours(Path(n).name)]
    for name in [*order, *gone]:  # a device node or FIFO where a result file goes is not ours to move
        refuse_special(out / name, "")
    backup.mkdir()
    moved, placed = [], []
    try:
        for name in [*order, *gone]:
            if os.path.lexists(out / name):
                os.replace(out / name, backup / name)
                moved.append(name)
        for name in order:
            os.replace(staging / name, out / name)
            placed.append(name)
    except BaseException:
        for name in placed:
            os.replace(out / name, staging / name)
        for name in moved:
            os.replace(backup / name, out / name)
        raise
    shutil.rmtree(backup, ignore_errors=True)


@contextmanager
def atomic_output_dir(out, marker: str, replaces: Sequence[str] = (), what: str = "result") -> Iterator[Path]:
    """Write one result into folder ``out`` whole or not at all; yields the staging folder to write into.

    Args:
        out: the output folder (created if missing; removed again on failure when it was created and is empty).
        marker: the result's main file (``norms.json``, ``report.json``): the lock is ``out/<marker>.lock``, and
            the marker is moved into place last, so a folder holding it holds the whole result.
        replaces: files of the previous result in ``out`` (its figures): removed once the new result is in place,
            unless written again.
        what: the result in messages ("norms result", "report").

    Raises:
        OutputError: another process holds the lock; the disk filled up or the folder became read-only.
    """
    from ..cache.lock import LockHeld, WriterLock  # here: importing interp.cache imports torch

    out = Path(os.path.abspath(out))
    refuse_special(out)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise (output_error(e, out, what) or e) from None
    lock = WriterLock(out / marker)
    try:
        lock.acquire()
    except LockHeld as e:
        raise OutputError(f"--out {str(out)!r} is being written by another interp run ({e.holder}); wait for it "
                          "to finish, or choose another --out") from None
    except OSError as e:
        raise (output_error(e, out, what) or e) from None
    stem = Path(marker).stem
    staging = out / f"{STAGING_PREFIX}{stem}-{os.getpid()}"
    done = False
    try:
        _clean_stale(out, stem, marker)
        staging.mkdir()
        _SHOWN[staging] = out
        yield staging
        _commit(staging, out, marker, replaces, out / f"{STAGING_PREFIX}{stem}-old-{os.getpid()}")
        done = True
    except OSError as e:
        error = output_error(e, out, what)
        if error is None:
            raise
        raise error from None
    finally:
        _SHOWN.pop(staging, None)
        shutil.rmtree(staging, ignore_errors=True)
        lock.release()
        if created and not done:
            try:
                out.rmdir()  # only when empty
            except OSError:
                pass
