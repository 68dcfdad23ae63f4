"""Capped exponential backoff with jitter, for loops that retry Redis."""

from __future__ import annotations

import random

_shared = random.Random()


class Backoff:
    """Delay ``U(c/2, c)``, ``c = min(cap_s, base_s * 2**n)``, after the n-th failure in a row."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0, rng: random.Random | None = None):
        self._base = base_s
        self._cap = cap_s
        self._n = 0
        # The module's shared generator unless one is given: a Random of its own costs
        # 2.5 KiB, and every owned stream holds a Backoff.
        self._rng: random.Random | None = rng

    def next_delay(self) -> float:
        ceiling = min(self._cap, self._base * (2 ** min(self._n, 30)))
        self._n += 1
        return (self._rng or _shared).uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._n = 0
