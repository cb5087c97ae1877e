"""Processes that a handler forks: they end with their handler, and never outlive the worker.

A handler that calls ``os.fork()`` makes a copy of the whole worker: its
handler thread, and the worker's open database connections and sockets. In
that copy only the forking thread runs. When the child's code returns from the
handler, or calls ``sys.exit()``, it would go back into the worker's handler
thread and wait there for work that never comes, holding the database file and
the sockets, forever.

So a child that comes back out of a handler exits at once, with the status the
handler asked for (``sys.exit(3)`` exits 3, a return exits 0, an exception
prints its traceback and exits 1), without running the worker's exit
handlers, which belong to the parent. And on Linux a child forked from a
handler thread is sent SIGTERM when that thread ends (the worker stops, or is
killed), so a child that never returns does not outlive its worker; it starts
with Python's default SIGTERM and SIGINT handlers, not the worker's drain.

Children that ``exec`` another program (``subprocess``) are not affected by
the first rule and are by the second only when forked with ``os.fork``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback

#: Set in the threads that run handlers (sync handler threads, the event loop).
_handler_thread = threading.local()
#: prctl(2)'s option that asks for a signal when the parent thread ends.
_PR_SET_PDEATHSIG = 1


def mark_handler_thread() -> None:
    """Called by each thread that runs handlers: children it forks die with it."""
    _handler_thread.active = True


def exit_if_forked(owner_pid: int, exc: BaseException | None) -> None:
    """In a child forked by a handler (not ``owner_pid``), exit now as the handler asked."""
    if os.getpid() == owner_pid:
        return
    code = _exit_status(exc)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more to say
            stream.flush()
    os._exit(code)


def _exit_status(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    traceback.print_exception(exc)
    return 1


def _after_fork_in_child() -> None:
    if not getattr(_handler_thread, "active", False) or not sys.platform.startswith("linux"):
        return
    # The worker's own signal handlers (SIGTERM and SIGINT start its drain) mean
    # nothing in a copy of it: the child gets Python's defaults back, so that
    # the signal below, or an operator's, ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the worker died before the request took effect
        os._exit(1)


os.register_at_fork(after_in_child=_after_fork_in_child)
