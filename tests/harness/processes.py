"""Process checks the harness's own tests make (Linux)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (zombies included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_dead(pid: int, timeout_s: float = 5.0) -> bool:
    """Poll until ``pid`` is gone; False if it still exists after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def child_pids() -> set[int]:
    """Pids of this process's children, from /proc."""
    me = os.getpid()
    children: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may contain spaces, so split after ")".
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me:
            children.add(int(entry.name))
    return children
