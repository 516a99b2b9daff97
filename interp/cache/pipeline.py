"""Two background threads that overlap work with the forward pass: a batch prefetcher (image decoding)
and a single writer (HDF5 writes), each behind a small bounded queue so memory stays flat."""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

from ..errors import CacheError
from .image_feed import ImageFeed, LoadedBatch

_END = object()
_POLL_S = 0.1


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """Iterates ``source.load`` over consecutive batches ``[start, start+batch_size), ...`` loaded ahead
    in a background thread (at most ``depth`` batches waiting). Errors re-raise in the consumer."""

    def __init__(self, source: ImageFeed, start: int, batch_size: int, depth: int = 2):
        self.source, self.start, self.batch_size = source, start, batch_size
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="interp-cache-loader", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        n = len(self.source)
        try:
            for s in range(self.start, n, self.batch_size):
                if not self._put(self.source.load(s, min(n, s + self.batch_size))):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the consumer
            self._put(_Failure(e))

    def __iter__(self) -> Iterator[LoadedBatch]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * _POLL_S + 1)


class BackgroundWriter:
    """Calls ``write_fn(item)`` for each submitted item, in order, in one thread.

    ``submit`` blocks while ``depth`` items are already waiting, so at most ``depth + 1`` items are in
    memory. A failure in ``write_fn`` stops the thread and re-raises from the next ``submit``/``finish``.
    """

    def __init__(self, write_fn: Callable, depth: int = 1):
        self.write_fn = write_fn
        self.error: BaseException = None
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="interp-cache-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            try:
                self.write_fn(item)
            except BaseException as e:
                self.error = e
                return

    def _raise_error(self) -> None:
        if self.error is not None:
            if isinstance(self.error, CacheError):
                raise self.error
            raise CacheError(f"writing the cache failed: {type(self.error).__name__}: {self.error}") from self.error

    def _put(self, item) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def submit(self, item) -> None:
        self._raise_error()
        self._put(item)
        self._raise_error()

    def finish(self, raise_errors: bool = True) -> None:
        """Write what is queued, stop the thread, and re-raise its failure (if ``raise_errors``)."""
        self._put(_END)
        self._thread.join()
        if raise_errors:
            self._raise_error()
