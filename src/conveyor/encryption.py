"""Arguments and results encrypted at rest, with keys that can be rotated.

An App given keys (``App(encryption_keys=[...])`` or ``CONVEYOR_ENCRYPTION_KEYS``,
comma-separated, newest first) seals a job's arguments when it is enqueued, its
result and its durable steps' results when they are recorded, and opens them
where they are read. The stores never see the difference: a sealed value is
text in the same column, a JSON string that begins with ``SEALED_PREFIX``
(see conveyor.job), so their SQL and Lua are those of clear jobs. Queue, task,
key, state and errors stay clear, so they can still be searched.

Fernet (AES-128-CBC with HMAC-SHA256, from the ``cryptography`` package) seals;
MultiFernet opens with any listed key and seals with the first, which is what
rotation needs. ``cryptography`` is imported only when keys are given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from conveyor.errors import ConfigurationError, EncryptedPayloadError
from conveyor.job import SEALED_PREFIX, Job, NewJob, is_sealed
from conveyor.store.payloads import PayloadChange, PayloadField, PayloadStore
from conveyor.store.records import Step

#: The environment variable of the keys: comma-separated, newest first.
KEYS_ENV = "CONVEYOR_ENCRYPTION_KEYS"

#: What the dashboard and the CLI show for a value no key of theirs opens.
SEALED_LABEL = "encrypted (no key here)"


def encryption_keys_setting(keys: Sequence[str | bytes] | str | None) -> list[bytes]:
    """The keys given to an App, else those of CONVEYOR_ENCRYPTION_KEYS; [] for none."""
    if keys is None:
        keys = os.environ.get(KEYS_ENV, "")
    if isinstance(keys, str):  # one string: the environment's comma-separated form
        keys = [part for part in keys.split(",") if part.strip()]
    found: list[bytes] = []
    for key in keys:
        if not isinstance(key, str | bytes):
            raise ConfigurationError(
                f"encryption keys must be strings or bytes, got {type(key).__name__}"
            )
        found.append((key.encode() if isinstance(key, str) else key).strip())
    return found


def payload_codec(keys: Sequence[str | bytes] | str | None) -> PayloadCodec | None:
    """The codec of these keys (or the environment's), or None when there are none."""
    found = encryption_keys_setting(keys)
    return PayloadCodec(found) if found else None


class PayloadCodec:
    """Seals and opens stored values with a list of Fernet keys, newest first."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        try:
            from cryptography.fernet import Fernet, InvalidToken, MultiFernet
        except ImportError:
            raise ConfigurationError(
                "encryption keys were given but the cryptography package is missing: "
                "pip install 'conveyor[encryption]'"
            ) from None
        if not keys:
            raise ConfigurationError("encryption needs at least one key")
        fernets = []
        for position, key in enumerate(keys, 1):
            try:
                fernets.append(Fernet(key))
            except ValueError:
                # The key itself is never echoed: it is a secret.
                raise ConfigurationError(
                    f"encryption key {position} of {len(keys)} is not a Fernet key "
                    "(32 url-safe base64-encoded bytes, as Fernet.generate_key() makes)"
                ) from None
        self._newest = fernets[0]
        self._all = MultiFernet(fernets)
        self._invalid = InvalidToken
        #: How many keys open values (the first seals).
        self.key_count = len(fernets)

    def __repr__(self) -> str:
        return f"<PayloadCodec keys={self.key_count}>"

    # --- single values ------------------------------------------------------------

    def seal(self, text: str) -> str:
        """``text`` (JSON) encrypted under the newest key, as it is stored."""
        return f'{SEALED_PREFIX}{self._newest.encrypt(text.encode()).decode("ascii")}"'

    def open(self, text: str, what: str = "the value") -> str:
        """The clear JSON of a stored value (clear values pass through).

        EncryptedPayloadError when no listed key opens it.
        """
        if not is_sealed(text):
            return text
        try:
            return self._all.decrypt(_token(text)).decode()
        except self._invalid:
            raise EncryptedPayloadError(
                f"{what} is encrypted and none of the {self.key_count} encryption key(s) "
                "given to this process opens it"
            ) from None

    def try_open(self, text: str) -> str:
        """The clear JSON of a stored value, or the value as stored when no key opens it."""
        try:
            return self.open(text)
        except EncryptedPayloadError:
            return text

    def reseal(self, text: str) -> str | None:
        """``text`` sealed under the newest key, or None when it is already.

        A clear value is sealed; a sealed one is opened with any listed key and
        sealed again. EncryptedPayloadError when no listed key opens it.
        """
        if not is_sealed(text):
            return self.seal(text)
        token = _token(text)
        try:
            self._newest.decrypt(token)
            return None  # under the newest key already: a rerun of a rotation skips it
        except self._invalid:
            pass
        return self.seal(self.open(text))

    # --- records --------------------------------------------------------------------

    def seal_new(self, jobs: Iterable[NewJob]) -> dict[str, str]:
        """Seal the arguments of jobs about to be inserted (in place).

        Returns the clear text of each sealed value, by sealed value: the jobs
        the insert gives back are opened from it (``open_job``'s ``known``)
        instead of being decrypted again.
        """
        known: dict[str, str] = {}
        for job in jobs:
            for name in ("args_json", "kwargs_json"):
                clear = getattr(job, name)
                if not is_sealed(clear):
                    sealed = self.seal(clear)
                    known[sealed] = clear
                    setattr(job, name, sealed)
        return known

    def open_job(self, job: Job, known: Mapping[str, str] | None = None) -> Job:
        """Open a job read from the store in place; what no key opens stays sealed.

        Reading a field left sealed raises EncryptedPayloadError, so a value is
        never taken for data while it is ciphertext. ``known``: clear texts by
        sealed value, from ``seal_new``.
        """
        for name in ("args_json", "kwargs_json", "result_json"):
            text = getattr(job, name)
            if is_sealed(text):
                clear = known.get(text) if known else None
                setattr(job, name, clear if clear is not None else self.try_open(text))
        return job

    def open_step(self, step: Step) -> Step:
        """A step read from the store, its result opened when a key opens it."""
        if not is_sealed(step.result_json):
            return step
        return dataclasses.replace(step, result_json=self.try_open(step.result_json))

    def seal_result(self, result_json: str | None) -> str | None:
        """A result about to be written, sealed (None and sealed text pass through)."""
        if result_json is not None and not is_sealed(result_json):
            return self.seal(result_json)
        return result_json


def _token(text: str) -> bytes:
    """The Fernet token inside a sealed value."""
    return text[len(SEALED_PREFIX) : -1].encode("ascii")


# --- rotation ----------------------------------------------------------------------

#: Jobs read per page by ``reencrypt``.
ROTATE_BATCH = 500


@dataclass
class RotationProgress:
    """How far a re-encryption went: rerun with ``after_id=last_id`` to go on from there."""

    #: Jobs read so far.
    jobs: int = 0
    #: Values written again under the newest key (clear ones sealed, older keys' resealed).
    rewritten: int = 0
    #: Values no listed key opens, left as they are.
    unreadable: int = 0
    #: The id of the last job read: everything up to it is done.
    last_id: int = 0
    #: Whether the walk reached the newest job.
    done: bool = False


def reencrypt(
    store: PayloadStore,
    codec: PayloadCodec,
    *,
    after_id: int = 0,
    batch_size: int = ROTATE_BATCH,
    on_batch: Callable[[RotationProgress], None] | None = None,
) -> RotationProgress:
    """Seal every stored job's values under the newest key, page by page.

    Values under the newest key already are left alone, so a rerun (after a
    crash, or from ``after_id``) writes only what is left. Each value is
    written only while it still holds what was read (the store decides), so
    jobs that run meanwhile lose nothing; a value sealed by an older key while
    the walk runs (by a process not yet given the new key) is left for a rerun.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be a positive integer, got {batch_size!r}")
    progress = RotationProgress(last_id=after_id)
    cursor: int | None = after_id
    while cursor is not None:
        page, cursor = store.payload_page(cursor, batch_size)
        changes = []
        for payload in page:
            values: list[tuple[PayloadField, str | None, str | None]] = [
                ("args", payload.args, None),
                ("kwargs", payload.kwargs, None),
                ("result", payload.result, None),
            ]
            values += [("step", result, name) for name, result in payload.steps]
            for field, old, step in values:
                if old is None:
                    continue
                try:
                    new = codec.reseal(old)
                except EncryptedPayloadError:
                    progress.unreadable += 1
                    continue
                if new is not None:
                    changes.append(PayloadChange(payload.id, field, old, new, step))
        if changes:
            progress.rewritten += store.payload_rewrite(changes)
        progress.jobs += len(page)
        if page:
            progress.last_id = page[-1].id
        if cursor is not None:
            progress.last_id = max(progress.last_id, cursor)
        progress.done = cursor is None
        if on_batch is not None and page:
            on_batch(progress)
    return progress
