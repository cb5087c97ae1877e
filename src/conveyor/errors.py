"""Every error conveyor raises, so callers can catch them by meaning."""

from __future__ import annotations

from datetime import datetime, timedelta


class ConveyorError(Exception):
    """Base class of every error conveyor raises."""


class ConfigurationError(ConveyorError, ValueError):
    """A DSN, an option or a name is malformed; the message says how to fix it."""


class InvalidJobError(ConveyorError, ValueError):
    """A job cannot be enqueued as given (payload not JSON, bad name, negative delay...).

    Raised before anything is written.
    """


class EncryptedPayloadError(ConveyorError, ValueError):
    """A job's arguments or result are encrypted and no key this process holds opens them.

    Raised when they are read (``job.args``, ``job.result``, a step's result);
    a worker fails such a job with this error instead of running its handler.
    """


class UnknownTaskError(ConveyorError, KeyError):
    """No task of that name is registered with the App."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain prose.
        return str(self.args[0]) if self.args else "unknown task"


class StoreUnavailableError(ConveyorError):
    """The database cannot be reached; the message names where conveyor tried to connect."""

    @classmethod
    def saying(cls, where: str, reason: str) -> StoreUnavailableError:
        """``{where}: {reason}``, the driver's reason ending as one sentence (a driver's
        own full stop or question mark kept, not doubled), then what to check."""
        reason = reason.strip()
        if not reason.endswith(("?", "!")):
            reason = reason.rstrip(". ") + "."
        return cls(f"{where}: {reason} Is the server running, and is the DSN right?")


class SchemaMissingError(ConveyorError):
    """The database lacks conveyor's tables, or an upgrade of them: run ``conveyor migrate``.

    Raised by ``App.check_schema()`` (and by commands, the dashboard and the
    worker, which call it) instead of a database's own "no such table" error.
    """


class JobNotFoundError(ConveyorError, LookupError):
    """No job has that id (it was never created, or was purged)."""


class JobStateError(ConveyorError):
    """The action does not apply to the job in its current state (e.g. retrying a running job)."""


class LeaseLostError(ConveyorError):
    """The caller's lease on a running job is no longer valid: its outcome was not recorded.

    Another worker may have rescued the job after the lease expired; the job's
    recorded outcome is never overwritten by a stale lease holder.
    """


class JobFailed(ConveyorError):
    """Raised by ``job.wait()`` when the job failed for good; carries the remote error."""

    def __init__(self, job_id: int, error: str | None) -> None:
        super().__init__(f"job {job_id} failed: {error or 'no error recorded'}")
        self.job_id = job_id
        self.error = error


class JobCancelled(ConveyorError):
    """Raised by ``job.wait()`` when the job was cancelled."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id


class Retry(Exception):
    """Raised by a handler to run the job again later without counting it as a failure."""

    def __init__(self, delay: float | timedelta = 0.0, reason: str | None = None) -> None:
        super().__init__(reason or f"retry requested in {delay}s")
        #: Seconds (or a timedelta) before the job runs again.
        self.delay = delay


class Sleeping(Retry):
    """Not an error: how ``ctx.sleep`` ends the attempt until the job's wake time.

    Let it through (a handler that catches every exception must re-raise it):
    the worker queues the job again for ``until`` without using up an attempt.
    """

    def __init__(self, until: datetime, delay: float) -> None:
        super().__init__(delay, f"sleeping until {until.isoformat()}")
        self.until = until


class Parked(Sleeping):
    """Not an error: how ``ctx.wait_for`` ends the attempt while the job waits.

    Let it through: the store has queued the job again already, for the
    wait's end, and a signal of the name waited for makes it due at once.
    """

    def __init__(self, until: datetime, delay: float, waits_for: str) -> None:
        super().__init__(until, delay)
        self.args = (f"waiting for {waits_for} until {until.isoformat()}",)
        self.waits_for = waits_for


class SignalTimeout(ConveyorError):
    """Raised by ``ctx.wait_for`` when no signal of that name came before its timeout.

    A handler may catch it and go on (the timeout is recorded as the wait's
    step: a replay raises it again at once).
    """

    def __init__(self, job_id: int, name: str, until: str) -> None:
        super().__init__(f"job {job_id}: no signal {name!r} came before {until}")
        self.job_id = job_id
        self.name = name
        self.until = until


class ChildFailed(ConveyorError):
    """Raised by ``ctx.wait`` when children it waited for failed or were cancelled.

    ``errors`` names each (by id) with its error; ``results`` holds the results
    of those that succeeded, by id.
    """

    def __init__(self, job_id: int, errors: dict[int, str], results: dict[int, object]) -> None:
        listed = "; ".join(f"job {i}: {e}" for i, e in sorted(errors.items()))
        super().__init__(f"job {job_id}: {len(errors)} child job(s) did not succeed: {listed}")
        self.errors = errors
        self.results = results


class Fail(Exception):
    """Raised by a handler to fail the job at once, with no further attempts."""
