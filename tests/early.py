"""Fresh processes the session runs in the background, ahead of the tests that wait on one: a torchrun launch,
a Jupyter kernel, a memory measurement, what ``import interp`` loads. Each spends seconds importing torch and
timm; started early, that runs on the core the in-process tests leave idle instead of holding the session up
when its test comes.

They run one at a time, in the order of the tests that wait on them, and while one runs the session's torch
keeps to one thread: two cores hold the session and one launch, while more (several launches, or torch's
threads on every core besides a launch) stall each other (round trips of 0.3 s took 3-5 s). A launch a test
waits on starts at once.

A launch is declared next to its test's code, ``@launcher(NAME)`` on a function (workdir) -> :class:`Launch`
(or None when there is nothing to run, e.g. an optional package is missing); a test that waits on it carries
``@pytest.mark.early(NAME)`` and calls :func:`result`, which starts it then if the session has not (a test run
by node id starts its own). ``tests/conftest.py`` queues the launches of the collected tests, starts the next
one before each test when none runs, and stops what is left at the end.

Under pytest-xdist (``-n``) a launch runs once per test run, not once per worker: the first worker whose test
asks for it runs it to the end (tests/built_once.py) and every worker reads how it ended, so a launch that
several tests share (the notebook's kernel, a fresh interpreter, the memory measurements) costs one
interpreter start wherever the scheduler sends those tests.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import pytest
import torch

from built_once import built_once

SAFETY_NET_S = 1800  # a hung child fails its test after this; never a timing assertion


@dataclass
class Launch:
    """What to start: ``argv``, run in ``cwd`` (default: the launch's workdir) with ``env`` added to the
    session's environment."""

    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None


@dataclass
class Finished:
    """A finished launch: its exit status, its output, and the workdir its launcher prepared."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path


LAUNCHERS: Dict[str, Callable[[Path], Optional[Launch]]] = {}
_STARTED: Dict[str, Tuple[Optional[subprocess.Popen], Path]] = {}
_ROOT: List[Path] = []  # the session's folder of workdirs, made on the first start
_QUEUE: List[str] = []  # launches to start, in the order of the tests that wait on them
# pytest-xdist (-n): each worker is a session of its own; the cores are shared between them, and a launch starts
# when its test asks for it (queued ahead, every worker would run every launch).
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_SESSION_THREADS = max(1, torch.get_num_threads() // XDIST_WORKERS)  # torch's threads when no launch runs


def launcher(name: str) -> Callable:
    """Decorator: the function (workdir) -> Launch that prepares and describes the launch ``name``."""
    def register(make: Callable[[Path], Optional[Launch]]) -> Callable[[Path], Optional[Launch]]:
        LAUNCHERS[name] = make
        return make

    return register


def start(name: str) -> None:
    """Start the launch ``name`` in a fresh workdir, once per session."""
    if name in _STARTED:
        return
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="interp-tests-early-")))
    workdir = _ROOT[0] / re.sub(r"[^\w.-]", "_", name)
    workdir.mkdir()
    spec = LAUNCHERS[name](workdir)
    proc = None
    if spec is not None:
        with open(workdir / "stdout.txt", "w") as out, open(workdir / "stderr.txt", "w") as err:
            proc = subprocess.Popen(spec.argv, cwd=spec.cwd or workdir, env={**os.environ, **spec.env},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    _STARTED[name] = (proc, workdir)


def result(name: str) -> Finished:
    """Wait for the launch ``name`` (starting it if needed) and return how it ended."""
    if name in _QUEUE:
        _QUEUE.remove(name)
    if XDIST_WORKERS > 1:
        return _shared_result(name)
    start(name)
    proc, workdir = _STARTED[name]
    if proc is None:
        pytest.fail(f"the launch {name!r} had nothing to run (its launcher returned None)")
    try:
        proc.wait(timeout=SAFETY_NET_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"{name}: no end in {SAFETY_NET_S} s: {(workdir / 'stderr.txt').read_text()[-3000:]}")
    return Finished(proc.returncode, (workdir / "stdout.txt").read_text(), (workdir / "stderr.txt").read_text(),
                    workdir)


def _shared_result(name: str) -> Finished:
    """How the launch ``name`` ended, run to the end by the first worker of the test run that asks."""
    def run(workdir: Path) -> None:
        spec = LAUNCHERS[name](workdir)
        if spec is None:
            (workdir / "nothing-to-run").touch()
            return
        with open(workdir / "stdout.txt", "w") as out, open(workdir / "stderr.txt", "w") as err:
            proc = subprocess.Popen(spec.argv, cwd=spec.cwd or workdir, env={**os.environ, **spec.env},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=SAFETY_NET_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            with open(workdir / "stderr.txt", "a") as err:
                err.write(f"\n{name}: no end in {SAFETY_NET_S} s (killed)\n")
        (workdir / "returncode.txt").write_text(str(proc.returncode))

    workdir = built_once("early-" + re.sub(r"[^\w.-]", "_", name), run)
    if (workdir / "nothing-to-run").exists():
        pytest.fail(f"the launch {name!r} had nothing to run (its launcher returned None)")
    return Finished(int((workdir / "returncode.txt").read_text()), (workdir / "stdout.txt").read_text(),
                    (workdir / "stderr.txt").read_text(), workdir)


def queue_for(items: Iterable[pytest.Item]) -> None:
    """Queue the launches the ``items`` are marked to wait on, in their order, and start the first."""
    if XDIST_WORKERS > 1:
        return
    for item in items:
        for mark in item.iter_markers("early"):
            if mark.args[0] not in _QUEUE and mark.args[0] not in _STARTED:
                _QUEUE.append(mark.args[0])
    advance()


def advance() -> None:
    """Start the next queued launch when none is running; set the session's torch threads for what runs."""
    if _QUEUE and not _running():
        start(_QUEUE.pop(0))
    torch.set_num_threads(1 if _running() else _SESSION_THREADS)


def _running() -> bool:
    return any(proc is not None and proc.poll() is None for proc, _ in _STARTED.values())


def stop_all() -> None:
    """Kill what is still running (a session cut short) and remove the workdirs."""
    for proc, _ in _STARTED.values():
        if proc is not None and proc.poll() is None:
            _kill(proc)
    _STARTED.clear()
    _QUEUE.clear()
    if _ROOT:
        shutil.rmtree(_ROOT.pop(), ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and whatever it started (torchrun's workers, a kernel)
    except ProcessLookupError:
        pass
    proc.wait()
