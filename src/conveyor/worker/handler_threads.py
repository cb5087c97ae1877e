"""The threads that run sync handlers.

A plain thread pool without futures: the worker already learns of each
handler's end through its ``done`` callback, and ``ThreadPoolExecutor``'s
future, work item and idle semaphore per call were a quarter of the worker's
own CPU time on short jobs.

Threads start on demand, up to ``size``. Work handed over after
``close()`` is dropped, so a job released at shutdown never starts here.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from conveyor.logs import job_fields
from conveyor.worker.executor import Running, escaped, run_sync
from conveyor.worker.forks import mark_handler_thread

log = logging.getLogger("conveyor.worker")


class HandlerThreads:
    def __init__(
        self, size: int, done: Callable[[Running], None], name: str = "conveyor-handler"
    ) -> None:
        self._size = size
        self._done = done
        self._name = name
        self._work: queue.SimpleQueue[Running | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def resize(self, size: int) -> None:
        """Up to ``size`` threads from now on (more are started as work comes; fewer leave
        the extra ones idle: the worker's slots say how many handlers run)."""
        with self._lock:
            self._size = max(size, 1)

    def submit(self, running: Running) -> None:
        """Run ``running``'s sync handler in one of the threads; ``done`` is told after."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are closed")
            if self._idle > 0:
                self._idle -= 1
            elif len(self._threads) < self._size:
                # Daemons: a handler that ignores its cancel signal must not keep a
                # stopped worker's process alive after its job was released.
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            # else every thread is busy: the work waits for the first one free.
        self._work.put(running)

    def _run(self) -> None:
        mark_handler_thread()
        while True:
            running = self._work.get()
            if running is None or self._closed:
                return
            try:
                run_sync(running)
            # Anything: this thread must live on and hand the attempt back, or
            # its job would stay running (run_sync keeps the handler's own errors).
            except BaseException as exc:
                escaped(running, exc)
            try:
                self._done(running)
            except Exception:
                log.exception(
                    "a handler thread failed to report job %s",
                    running.id,
                    extra=job_fields(running.job),
                )
            del running  # the job and its payload are not kept alive while idle
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Stop the threads once their current handlers return; never-started work is dropped."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
