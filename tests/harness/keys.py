"""Cleanup of a test's keys on a server other tests (or people) may share."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

_BATCH = 500


def glob_escape(text: str) -> str:
    """Escape Redis glob specials (``* ? [ ] \\``) so *text* matches literally."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


async def delete_keys_containing(client: Redis | RedisCluster, fragment: str) -> int:
    """Delete every key whose name contains *fragment*; return how many were deleted.

    Uses SCAN (never KEYS, FLUSHDB or FLUSHALL; on a cluster, every primary) and
    single-key DELs, so it is safe on a shared server and needs no two keys to share
    a hash slot.

    Raises:
        ValueError: *fragment* is empty (that would match every key).
    """
    if not fragment:
        raise ValueError("refusing to delete keys matching an empty fragment")
    deleted = 0
    batch: list[bytes | str] = []

    async def flush() -> int:
        async with client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.delete(key)
            results = await pipe.execute()
        batch.clear()
        return sum(int(n) for n in results)

    async for key in client.scan_iter(match=f"*{glob_escape(fragment)}*", count=1000):
        batch.append(key)
        if len(batch) >= _BATCH:
            deleted += await flush()
    if batch:
        deleted += await flush()
    return deleted
