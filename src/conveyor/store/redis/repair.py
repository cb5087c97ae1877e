"""Rebuilding the sets that mirror each job's own keys (``sets_repair.lua``).

``retaining`` (the finished jobs with their own rule for the state they ended
in, for ``job_purge_retained``) and ``parked`` (the jobs with a wait mark, for
``parked_counts``) are kept by the scripts that change a job; a server whose
sets were lost (a key deleted by hand, a restore of part of the keys) has them
rebuilt from the jobs themselves by ``repair_sets``.
"""

from __future__ import annotations

import re

from conveyor.store.redis.core import CoreMixin

#: Ids one call of the script repairs: a slice short enough not to hold Redis up.
_SLICE = 1000


class RedisRepair(CoreMixin):
    """Mixed into RedisStore: the walk that rebuilds ``retaining`` and ``parked``."""

    def repair_sets(self) -> dict[str, int]:
        """Rebuild ``retaining`` and ``parked`` from every job's keys; the size of each after.

        Safe while workers run: each slice is one script, and a job changed between
        slices was put right by the script that changed it."""
        finished = self._ids_in_zset("finished") + self._ids_in_zset("retaining")
        parked = self._wait_marked() + self._do(
            lambda: sorted(self._client.smembers(self._k("parked")))
        )
        return {
            "retaining": self._repair("retaining", finished),
            "parked": self._repair("parked", parked),
        }

    def _repair(self, which: str, ids: list[str]) -> int:
        unique = list(dict.fromkeys(ids))
        size = int(self._run("sets_repair", which))  # the size when there is nothing to walk
        for at in range(0, len(unique), _SLICE):
            size = int(self._run("sets_repair", which, *unique[at : at + _SLICE]))
        return size

    def _ids_in_zset(self, name: str) -> list[str]:
        return [str(i) for i, _ in self._do(lambda: list(self._client.zscan_iter(self._k(name))))]

    def _wait_marked(self) -> list[str]:
        """The ids of the jobs with a wait mark (wait:<id>, a hash; a queue's wait index
        under the same word is a sorted set, and its name is not a number)."""
        start = len(self._k("wait:"))
        # The prefix as a glob matches itself only: its special characters escaped.
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._k("wait:")) + "*"

        def walk() -> list[str]:
            keys = self._client.scan_iter(match=pattern, count=1000, _type="hash")
            return [str(key)[start:] for key in keys]

        return [i for i in self._do(walk) if i.isdigit()]
