"""A real Sentinel set-up for tests: a primary, a replica and three sentinels, all
child processes of the server binary (``--sentinel`` mode for the sentinels), on free
ports, stopped and removed by :meth:`SentinelGroup.stop`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from redis import Redis

from streamjobs.testing import HOST, RedisServer, free_port, server_binary

MASTER = "streamjobs-test"


class SentinelGroup:
    """Primary + replica + 3 sentinels (quorum 2), failing over within seconds."""

    def __init__(self, *, down_after_ms: int = 1000, failover_timeout_ms: int = 5000) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no server binary for the sentinel group")
        self._binary = binary
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self.primary = RedisServer(dir_prefix="streamjobs-sentinel-primary-")
        self.replica: RedisServer | None = None
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []
        self._dir = Path(tempfile.mkdtemp(prefix="streamjobs-sentinels-"))

    def start(self, timeout_s: float = 30.0) -> Self:
        self.primary.start()
        self.replica = RedisServer(
            dir_prefix="streamjobs-sentinel-replica-",
            extra_args=["--replicaof", HOST, str(self.primary.port)],
        ).start()
        for i in range(3):
            port = free_port()
            conf = self._dir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind {HOST}\ndir {self._dir}\n"
                f"sentinel monitor {MASTER} {HOST} {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {self._down_after_ms}\n"
                f"sentinel failover-timeout {MASTER} {self._failover_timeout_ms}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            with (self._dir / f"sentinel-{i}.log").open("wb") as log:  # the child keeps a copy
                self._sentinels.append(
                    subprocess.Popen(
                        [self._binary, str(conf), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.sentinel_ports.append(port)
        deadline = time.monotonic() + timeout_s
        while not self._settled():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the sentinel group did not settle")
            time.sleep(0.1)
        return self

    def _settled(self) -> bool:
        """Every sentinel answers and knows the replica and the other sentinels."""
        try:
            for port in self.sentinel_ports:
                with Redis(host=HOST, port=port, socket_timeout=1) as s:
                    info = s.execute_command("SENTINEL", "MASTER", MASTER)
                    fields = (
                        dict(zip(info[::2], info[1::2], strict=True))
                        if isinstance(info, list)
                        else info
                    )
                    fields = {
                        (k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()
                    }
                    if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                        return False
        except Exception:
            return False
        return True

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [(HOST, p) for p in self.sentinel_ports]

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        with Redis(host=HOST, port=self.sentinel_ports[0], socket_timeout=1) as s:
            _, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return int(port)

    def stop(self) -> None:
        for proc in self._sentinels:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self._sentinels = []
        if self.replica is not None:
            self.replica.stop()
        self.primary.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
