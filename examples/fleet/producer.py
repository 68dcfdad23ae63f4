"""Queue albums for the fleet: one stream per album, one entry per image.

    python examples/fleet/producer.py --service images [--albums 6] [--images 20]
                                      [--work-ms 50] [REDIS_URL]

Each album is queued (``add_stream``), filled and closed (its end marker) at once;
the workers of the service share them out.
"""

from __future__ import annotations

import argparse

import anyio
from redis.asyncio import Redis

from streamjobs import Producer


async def produce(url: str, service: str, albums: int, images: int, work_ms: int) -> None:
    redis = Redis.from_url(url)
    try:
        producer = Producer(redis, service=service)
        for album in range(albums):
            stream = f"{service}:album:{album}"
            await producer.add_stream(stream, {"work_ms": work_ms})  # info for the handler
            for n in range(images):
                await producer.append(stream, {"image": f"img-{n:03d}.jpg"})
            await producer.close_stream(stream)
    finally:
        await redis.aclose()
    print(f"queued {albums} albums of {images} images for service {service}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/0")
    p.add_argument("--service", required=True)
    p.add_argument("--albums", type=int, default=6)
    p.add_argument("--images", type=int, default=20)
    p.add_argument("--work-ms", type=int, default=50, help="time to resize one image")
    ns = p.parse_args()
    anyio.run(produce, ns.url, ns.service, ns.albums, ns.images, ns.work_ms)


if __name__ == "__main__":
    main()
