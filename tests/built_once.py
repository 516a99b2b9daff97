"""Test data built once per test run and shared by every pytest-xdist worker (``-n``): the first worker to ask
builds it under a file lock while the others wait, then all read it. Without xdist, once per process.

Only for deterministic data that tests read and never change (a trained test SAE, a report folder): a test that
needs to change it copies it first.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


SHARED_ENV = "INTERP_TESTS_SHARED"  # the run's shared folder, made by the main pytest process; workers inherit it


def shared_root() -> str:
    """Make the run's shared folder and name it in the environment (the xdist workers started after this see it);
    :func:`remove_shared_root` removes it at the end of the run."""
    os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="interp-tests-")
    return os.environ[SHARED_ENV]


def remove_shared_root() -> None:
    root = os.environ.pop(SHARED_ENV, None)
    if root:
        shutil.rmtree(root, ignore_errors=True)


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled, built by the first caller of this test run."""
    root = Path(os.environ.get(SHARED_ENV) or shared_root())
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that died mid-build left
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder
