"""The power a step's loop acts on when pacing idles the GPU in long stretches.

A step paced only between steps (a compiled or graphed step has no pacing point inside it)
alternates hundreds of milliseconds at full power with as long idle: a reading of NVML's
instant power shows whichever phase it fell in, and a loop acting on it would cut at
every busy phase. The energy counter integrates every millisecond, so its rise over the
last pacing cycle or two is the power the 1 s windows will see. `CounterPower` keeps the
counter's recent readings and gives that average; the controller hands it to the
governor in place of the instant reading while a step's pacing cycle is longer than a
sensor tick (flashwatt.control.controller).
"""
from __future__ import annotations

import collections

# The average is taken over this many pacing cycles, at most MAX_WINDOW_S.
CYCLES = 2.0
MAX_WINDOW_S = 1.0


class CounterPower:
    def __init__(self):
        self._history: collections.deque = collections.deque()  # (t, joules)

    def add(self, t: float, energy_mj: float | None) -> None:
        if energy_mj is None:
            return
        self._history.append((t, energy_mj / 1e3))
        while self._history and self._history[0][0] < t - MAX_WINDOW_S - 0.5:
            self._history.popleft()

    def average_w(self, t: float, cycle_s: float) -> float | None:
        """Average power over the last CYCLES pacing cycles (at most MAX_WINDOW_S), from the
        counter; None without two readings that far apart."""
        window = min(MAX_WINDOW_S, CYCLES * cycle_s)
        older = [(ts, j) for ts, j in self._history if ts <= t - window + 1e-9]
        if not older or not self._history:
            return None
        (t0, j0), (t1, j1) = older[-1], self._history[-1]
        return (j1 - j0) / (t1 - t0) if t1 > t0 else None
