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

Until the counter holds a window (a run's first two cycles, and the first two after a gap in
the readings), the instant reading is a phase of a cycle: a busy phase reads the watts of full
duty, so a loop acting on it took 300-400 W of them for another tenant's and cut to its lowest
duty (an H200 at 0.25 s cycles: phantom tenants of 367 and 445 W in one run, at 0.3 s and
right after an NVML gap). Such a tick is handed on marked `mid_cycle`: telemetry that works,
with no reading of our watts (`windowed`).

That average is paired with the duty the board ran at over the same window: the share of
the window the GPU was given work, not slept by the pacer (its idle time, the sleep in progress
included) nor waited by the host between steps after one that ended drained (a loader, logging;
flashwatt.control.pacing, `Pacer.step_ended`). The share not slept alone, the host's waits
counted busy, comes with it (`paced_duty`): a stall of our own work is told against it
(flashwatt.control.work_stall), as the work the pacer expected. A
window of two cycles shows the duty of a second ago as much as the duty now; read against
the duty set now, a table would learn (and the loop would answer) the power of another
duty, and a loop that climbs while its reading lags swings from the lowest duty to the
highest. Against the duty realized in the window, each window is one exact point of the
duty -> power curve whatever the duty did in it, and whatever phase of a cycle it starts in.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, replace

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
    paced_duty: float | None = None  # the share of it the pacer did not sleep (the host's own waits counted busy)


class CounterPower:
    def __init__(self):
        # (t, joules, idle seconds paced so far) of the reads that moved: a read that returns
        # the read before's value (the counter stalled: a board never draws 0 W) holds the
        # energy of a tick ago, and a window ending or starting on it would miss that tick's
        # joules or count them twice; so a window's ends are reads that moved.
        self._history: collections.deque = collections.deque()
        self.read_once = False  # whether the board's counter ever answered (else nothing to window)

    def add(self, t: float, energy_mj: float | None, idle_s: float = 0.0, waited_s: float = 0.0) -> None:
        if energy_mj is None:
            return
        joules = energy_mj / 1e3
        self.read_once = True
        if self._history and joules == self._history[-1][1]:
            return  # stalled
        if self._history and joules < self._history[-1][1]:
            self._history.clear()  # the counter went back (a driver reset): windows start afresh
        self._history.append((t, joules, idle_s, waited_s))
        while self._history and self._history[0][0] < t - MAX_WINDOW_S - 0.5:
            self._history.popleft()

    def window(self, t: float, cycle_s: float) -> WindowPower | None:
        """Average power and realized duty over the last CYCLES pacing cycles (at most
        MAX_WINDOW_S) up to the last read that moved, from the counter; None without two
        such reads that far apart."""
        window = min(MAX_WINDOW_S, CYCLES * cycle_s)
        if not self._history:
            return None
        t1, j1, idle1, waited1 = self._history[-1]
        older = [entry for entry in self._history if entry[0] <= t1 - window + 1e-9]
        if not older or t - t1 > window:
            return None
        t0, j0, idle0, waited0 = older[-1]
        if t1 <= t0:
            return None
        seconds = t1 - t0
        paced = min(1.0, max(0.0, 1.0 - (idle1 - idle0) / seconds))
        duty = min(paced, max(0.0, paced - (waited1 - waited0) / seconds))
        return WindowPower((j1 - j0) / seconds, duty, seconds, paced)


def windowed(counter: CounterPower, reading, cycle_s: float, period_s: float):
    """The reading the governor acts on for this tick (a flashwatt.control.governor.Reading,
    already added to `counter`): while a pacing cycle is longer than a tick, the counter's
    average over the last cycles with the duty realized in it (ending at its last read that
    moved, if this tick's read failed); with no such window, the instant reading marked
    `mid_cycle` (module docstring). As it is without pacing cycles, without a reading, or on
    a board whose counter never answered (nothing to window)."""
    if reading.power_w is None or cycle_s <= period_s or not counter.read_once:
        return reading
    seen = counter.window(reading.t, cycle_s)
    if seen is None:
        return replace(reading, mid_cycle=True)
    return replace(reading, power_w=seen.watts, duty=seen.duty, window_s=seen.seconds, paced_duty=seen.paced_duty)
