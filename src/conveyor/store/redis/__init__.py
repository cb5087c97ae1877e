"""The Redis store (redis://, rediss://, unix:// DSNs): Lua scripts, pub/sub wake-ups."""

from conveyor.store.redis.store import RedisStore

__all__ = ["RedisStore"]
