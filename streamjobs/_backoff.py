"""Capped exponential backoff with jitter, for loops that retry Redis."""

from __future__ import annotations

import random


class Backoff:
    """Delay ``U(c/2, c)``, ``c = min(cap_s, base_s * 2**n)``, after the n-th failure in a row."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0, rng: random.Random | None = None):
        self._base = base_s
        self._cap = cap_s
        self._n = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self._cap, self._base * (2 ** min(self._n, 30)))
        self._n += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._n = 0
