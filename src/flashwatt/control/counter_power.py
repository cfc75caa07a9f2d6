"""The power the loop acts on and learns from when pacing idles the GPU in long stretches: a
step's, and attention calls' where they idle in whole cycles (flashwatt.control.pacing,
`target_cycle_s`).

A step paced only between steps (a compiled or graphed step has no pacing point inside it)
alternates hundreds of milliseconds at full power with as long idle: a reading of NVML's
instant power shows whichever phase it fell in, and a loop acting on it would cut at
every busy phase. The energy counter integrates every millisecond, so its rise over the
last pacing cycle or two is the power the 1 s windows will see. `CounterPower` keeps the
counter's recent readings and gives that average; the controller hands it to the
governor in place of the instant reading while a pacing cycle is longer than a sensor
tick (flashwatt.control.controller).

That average is paired with the duty the board ran at over the same window: the share of
the window not slept by the pacer (its idle time, the sleep in progress included). A
window of two cycles shows the duty of a second ago as much as the duty now; read against
the duty set now, a table would learn (and the loop would answer) the power of another
duty, and a loop that climbs while its reading lags swings from the lowest duty to the
highest. Against the duty realized in the window, each window is one exact point of the
duty -> power curve whatever the duty did in it, and whatever phase of a cycle it starts in.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

# The average is taken over this many pacing cycles, at most MAX_WINDOW_S.
CYCLES = 2.0
MAX_WINDOW_S = 1.0


@dataclass(frozen=True)
class WindowPower:
    """The board over a window ending now: its average power from the counter, the duty
    realized in it (busy share of its seconds) and its length."""

    watts: float
    duty: float
    seconds: float


class CounterPower:
    def __init__(self):
        self._history: collections.deque = collections.deque()  # (t, joules, idle seconds paced so far)

    def add(self, t: float, energy_mj: float | None, idle_s: float = 0.0) -> None:
        if energy_mj is None:
            return
        self._history.append((t, energy_mj / 1e3, idle_s))
        while self._history and self._history[0][0] < t - MAX_WINDOW_S - 0.5:
            self._history.popleft()

    def window(self, t: float, cycle_s: float) -> WindowPower | None:
        """Average power and realized duty over the last CYCLES pacing cycles (at most
        MAX_WINDOW_S), from the counter; None without two readings that far apart."""
        window = min(MAX_WINDOW_S, CYCLES * cycle_s)
        older = [entry for entry in self._history if entry[0] <= t - window + 1e-9]
        if not older or not self._history:
            return None
        (t0, j0, idle0), (t1, j1, idle1) = older[-1], self._history[-1]
        if t1 <= t0:
            return None
        seconds = t1 - t0
        duty = min(1.0, max(0.0, 1.0 - (idle1 - idle0) / seconds))
        return WindowPower((j1 - j0) / seconds, duty, seconds)
