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


def _run_root(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"interp-tests-{run}"


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled, built by the first caller of this test run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nobody to share with
        folder = Path(tempfile.mkdtemp(prefix=f"interp-{name}-"))
        build(folder)
        return folder
    root = _run_root(run)
    root.mkdir(exist_ok=True)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that died mid-build left
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def remove_run_folders(config) -> None:
    """At the end of an xdist run, in the controller (its workers are done): remove what the run built."""
    session = config.pluginmanager.getplugin("dsession")
    nodes = getattr(session, "nodemanager", None)
    if nodes is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_run_root(nodes.testrunuid), ignore_errors=True)
