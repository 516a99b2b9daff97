"""Child processes forked from the test process, for tests that kill, interrupt or limit a run.

A fresh ``python -m interp ...`` pays the interpreter start-up and the imports of torch, timm and interp (about
8 s on 2 cores) before doing anything; a forked child starts with them imported. What these tests check is the
process boundary (a ``kill -9``, a Ctrl-C, a file-size limit, another process holding a lock or writing a file,
DDP ranks), which a fork gives as well. Tests that check what a *fresh* interpreter imports (``'torch' in
sys.modules``) or how much memory a run takes (a child inherits the parent's heap) keep using ``subprocess``.
"""
from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Callable, Optional, Tuple

import torch

from interp.cli import main


class Forked:
    """``fn(*args)`` in a forked child; its exit status is what ``fn`` returns (an int; 0 for ``None``), or 1
    after an exception (traceback on the child's stderr). A ``subprocess.Popen``-like handle.

    Args:
        fn: runs in the child; it must not return into pytest, so the child always ends in ``os._exit``.
        capture: the child's stdout and stderr go to pipes (:attr:`stdout`, :attr:`stderr`, text) instead of
            the test's.
        before: runs in the child before ``fn`` (a ``resource.setrlimit``, say).

    In the child, SIGINT gets Python's default handler (a test run as a background job ignores it) and torch
    uses one thread: GNU OpenMP is not fork-safe once the parent has run a parallel region.
    """

    def __init__(self, fn: Callable, *args, capture: bool = False, before: Optional[Callable[[], None]] = None):
        sys.stdout.flush()
        sys.stderr.flush()
        pipes = (os.pipe(), os.pipe()) if capture else ()
        with warnings.catch_warnings():
            # Python >= 3.12 warns on a fork while other threads exist (torch's pool): the child runs only
            # this thread's work, with one torch thread.
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            self.pid = os.fork()
        if self.pid == 0:
            self._child(fn, args, pipes, before)
        self.returncode: Optional[int] = None
        self.stdout = self.stderr = None
        if capture:
            (out_r, out_w), (err_r, err_w) = pipes
            os.close(out_w)
            os.close(err_w)
            self.stdout = io.open(out_r, "r", encoding="utf-8", errors="replace")
            self.stderr = io.open(err_r, "r", encoding="utf-8", errors="replace")

    @staticmethod
    def _child(fn, args, pipes, before) -> None:
        status = 1
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            torch.set_num_threads(1)
            if pipes:
                (out_r, out_w), (err_r, err_w) = pipes
                os.close(out_r)
                os.close(err_r)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
            if before is not None:
                before()
            result = fn(*args)
            status = 0 if result is None else int(result)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - the child reports everything and exits
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)

    def poll(self) -> Optional[int]:
        """The exit status (``-signal`` for a killed child), or None while it runs."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = 1800) -> int:
        """The exit status, once the child has ended. ``timeout`` is a safety net against a hung child only
        (it is killed and the test fails), never a timing assertion."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the forked child {self.pid} hung: killed after {timeout:.0f} s")
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped yet: the pid is still this child's (a zombie at worst)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self) -> Tuple[str, str]:
        """(stdout, stderr) of a captured child, the rest of each read to its end (both at once: a child
        blocked on one full pipe would never end), once it has exited."""
        texts = ["", ""]

        def read(i, stream):
            texts[i] = stream.read()

        readers = [threading.Thread(target=read, args=(i, stream))
                   for i, stream in enumerate((self.stdout, self.stderr)) if stream is not None]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        self.wait()
        return texts[0], texts[1]

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> bool:
        """A child still running when the test ends (it failed) is killed, never left behind."""
        if self.poll() is None:
            self.kill()
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return False


def cli(*argv: str) -> int:
    """``interp ARGV`` (``interp.cli.main``), for a forked child."""
    return main([str(a) for a in argv])
