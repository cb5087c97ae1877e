"""DurabilityReport on Redis: what persists the data, read off the server's settings."""

from __future__ import annotations

import redis

from conveyor.store.redis.core import CoreMixin


class DurabilityMixin(CoreMixin):
    """The server's persistence and eviction settings, and warnings (``DurabilityReport``)."""

    def persistence(self) -> dict[str, str] | None:
        """The server's persistence and eviction settings; None if CONFIG is off."""
        try:
            with self._guard():
                found: dict[str, str] = {}
                for name in ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy"):
                    found.update(self._client.config_get(name))
                return found
        except redis.ResponseError:
            return None  # CONFIG renamed or disabled (managed Redis services)

    def durability(self) -> tuple[str, str | None]:
        """The persistence settings in words, and a warning when jobs could be lost."""
        found = self.persistence()  # one read of the settings for both checks
        said, warning = self._durability(found)
        evicts = self._eviction_warning(found or {})
        if evicts:
            warning = f"{warning}; {evicts}" if warning else evicts
        return said, warning

    def _eviction_warning(self, found: dict[str, str]) -> str | None:
        """A warning when a full Redis would delete keys (jobs among them) to make room."""
        policy = found.get("maxmemory-policy", "noeviction")
        if found.get("maxmemory", "0") in ("0", "") or policy == "noeviction":
            return None
        return (
            f"Redis at {self.where} has maxmemory-policy {policy}: when its memory fills it "
            "deletes keys, jobs among them; set maxmemory-policy noeviction"
        )

    def _durability(self, found: dict[str, str] | None) -> tuple[str, str | None]:
        if found is None:
            return "persistence unknown", (
                f"cannot read the persistence settings of Redis at {self.where} (CONFIG is "
                "disabled): make sure it runs with appendonly yes, or a restart loses jobs"
            )
        aof = found.get("appendonly", "?")
        fsync = found.get("appendfsync", "?")
        save = found.get("save", "").strip()
        said = f"appendonly {aof}, appendfsync {fsync}, save {save or 'off'}"
        if aof != "yes" and not save:
            return said, (
                f"persistence is OFF on Redis at {self.where}: a restart of Redis loses "
                "every job; run it with appendonly yes (appendfsync everysec or always)"
            )
        if aof != "yes":
            return said, (
                f"Redis at {self.where} only takes snapshots (save {save}): a crash loses the "
                "jobs written since the last one; run it with appendonly yes"
            )
        if fsync == "no":
            return said, (
                f"Redis at {self.where} has appendfsync no: a crash of its host can lose "
                "the last 30 seconds or so of acknowledged writes; use everysec or always"
            )
        return said, None
