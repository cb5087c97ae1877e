"""The threads that run sync handlers.

A plain thread pool without futures: the worker already learns of each
handler's end through its ``done`` callback, and ``ThreadPoolExecutor``'s
future, work item and idle semaphore per call were a quarter of the worker's
own CPU time on short jobs.

Threads start on demand, up to ``size``. They are not daemons, like the
executor's: a process exits after its handlers have returned. Work handed over
after ``close()`` is dropped, so a job released at shutdown never starts here.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from conveyor.worker.execution import Running, run_sync

log = logging.getLogger("conveyor.worker")

_Work = tuple[Running, Callable[[Running], None]]


class HandlerThreads:
    def __init__(self, size: int, name: str = "conveyor-handler") -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, running: Running, done: Callable[[Running], None]) -> None:
        """Run ``running``'s sync handler in one of the threads; ``done`` is called after."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are closed")
            if self._idle > 0:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}_{len(self._threads)}"
                )
                self._threads.append(thread)
                thread.start()
            # else every thread is busy: the work waits for the first one free.
        self._work.put((running, done))

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None or self._closed:
                return
            try:
                run_sync(*item)
            except Exception:  # run_sync reports the handler's own errors; this is ours
                log.exception("a handler thread failed to report its job")
            del item  # the job and its payload are not kept alive while idle
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Stop the threads once their current handlers return; never-started work is dropped."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
