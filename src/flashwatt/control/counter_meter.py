"""The judge's reading of the board's energy counter: each value with the time it was measured.

NVML's energy counter (`nvmlDeviceGetTotalEnergyConsumption`) changes about every 100 ms
(shared/design/MEASUREMENT.md): a read returns the energy up to the counter's last update,
which lies anywhere up to 0.1 s before the read (0.045 s on average on the H100:
flashwatt.control.table_error.COUNTER_LAG). A 1 s window judged from two reads 1 s apart is
the energy of a window that ended that much earlier. Across a budget step down it holds that
much of the power from before the step, across a step up as much less: at the average lag, a
step from 496 W to 261 W in the middle of a window (378 W of budget over it) reads 2.8 % over
what the board drew in it, and a step up as much under. Over steady power the two agree.

`CounterMeter` polls the counter on a thread of its own and keeps `(t, mJ)` for each change: the
time is the middle of the span between the read that last showed the old value and the one
that first showed the new, so each update is placed within a few milliseconds (PLACED_WITHIN_S). It polls every `poll_s` near the expected
update (the median of the last gaps between updates), and sleeps through the rest of the gap,
so it wakes about ten times per update rather than fifty. An update that came during such a
sleep (early: the gaps vary by a few milliseconds, rarely by more than EARLY_S) could lie
anywhere in it: it is counted (`unplaced`) and left out, the updates on either side of it
spanning its time; so is the value of the first read. `energy_at(times)` interpolates
between the updates: what the board's counter said at those times, each 1 s window then the
energy of that second.

The meter reads; it never acts, and nothing of the controller depends on it (the study
starts it beside the controller, as an independent judge).
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Callable

import numpy as np

POLL_S = 0.002
# How early, before an update is due, the meter starts polling: the gaps between updates vary
# by a few milliseconds.
EARLY_S = 0.02
GAPS_KEPT = 9
# After a read that gave no value (NVML failing, a board without the counter), the next read
# waits this long: nothing to time meanwhile.
UNREAD_WAIT_S = 0.05
# An update is placed where the reads around it span at most this long (from the start of the
# read that showed the old value to the end of the one that showed the new: its time is then
# known to half of it); a thread held up longer (the interpreter's lock, the OS) leaves it unplaced.
PLACED_WITHIN_S = 0.008


class CounterMeter:
    """Polls `read()` (the counter in mJ, None when it cannot be read) until stopped."""

    def __init__(self, read: Callable[[], float | None], poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic):
        if poll_s <= 0:
            raise ValueError(f"the meter's poll must be positive, got {poll_s} s")
        self.read, self.poll_s, self.clock = read, poll_s, clock
        self.samples: list[tuple[float, float]] = []  # (time of the update, mJ)
        self.polls = 0
        self.unplaced = 0  # updates seen only after a sleep or at the first read: their time unknown, not used
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flashwatt-counter-meter", daemon=True)

    def start(self) -> "CounterMeter":
        self._thread.start()
        return self

    def stop(self, after: float | None = None, wait_s: float = 0.5) -> None:
        """Stop polling; given `after` (a time of the clock), first wait, for at most `wait_s`,
        until an update later than it has been seen, so that energy_at covers every time up to
        it (the run's last tick)."""
        if after is not None:
            end = self.clock() + wait_s
            while self._thread.is_alive() and self.clock() < end and not (self.samples and self.samples[-1][0] > after):
                time.sleep(self.poll_s)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        value_seen: float | None = None  # the counter's value at the last poll that read it
        seen_t: float | None = None  # the start of that poll: the value held at some time after it
        gaps: list[float] = []
        try:
            while not self._stop.is_set():
                before = self.clock()
                value = self.read()
                after = self.clock()
                self.polls += 1
                if value is None:
                    value_seen = seen_t = None  # a failed read: the next change's time is not known
                    self._stop.wait(UNREAD_WAIT_S)  # (no counter to time: asked again now and then)
                    continue
                elif value != value_seen:
                    # the update came after the old value was read (at the earliest, when that
                    # poll began) and before this read returned: placed in the middle where that
                    # span is short; after a sleep, a held-up thread or at the first read it may
                    # lie anywhere in it, and it is not used (the updates on either side of it are)
                    if value_seen is not None and seen_t is not None and after - seen_t <= PLACED_WITHIN_S:
                        at = 0.5 * (seen_t + after)
                        if self.samples:
                            gaps = [*gaps[-(GAPS_KEPT - 1):], at - self.samples[-1][0]]
                        self.samples.append((at, float(value)))
                    else:
                        self.unplaced += 1
                    value_seen, seen_t = value, before
                    if len(gaps) >= 3:
                        # sleep through the gap to just before the next update is due
                        due = self.samples[-1][0] + statistics.median(gaps) - EARLY_S
                        self._stop.wait(max(self.poll_s, due - self.clock()))
                        continue
                else:
                    seen_t = before
                self._stop.wait(self.poll_s)
        except BaseException as err:  # noqa: BLE001 - the study reports it with the run
            self.error = err

    def energy_at(self, times) -> np.ndarray:
        """The counter (mJ) at each of `times`, interpolated between its updates; NaN outside
        the updates seen."""
        times = np.asarray(times, dtype=float)
        if len(self.samples) < 2:
            return np.full(times.shape, np.nan)
        t, e = np.array(self.samples, dtype=float).T
        inside = (times >= t[0]) & (times <= t[-1])
        return np.where(inside, np.interp(times, t, e), np.nan)


def first_counter(telemetry) -> Callable[[], float | None] | None:
    """A read of the energy counter (mJ) of `telemetry`'s first GPU, for a meter; None without
    working telemetry (no meter starts then)."""
    if not getattr(telemetry, "available", False):
        return None
    return lambda: (telemetry.energy_mj() or [None])[0]


def meter_for(telemetry) -> CounterMeter | None:
    """A started meter of `telemetry`'s first GPU's counter; None without working telemetry."""
    read = first_counter(telemetry)
    return CounterMeter(read).start() if read is not None else None


def meter_merit(meter: CounterMeter | None) -> dict:
    """How a run's counter was metered, for its record: the updates placed, their median gap, the
    polls taken and the updates left out (seen only after a sleep or a held-up read); a meter
    that failed says why (its run is then judged at the controller's reads)."""
    if meter is None:
        return {"meter_updates": 0}
    if meter.error is not None:
        return {"meter_updates": 0, "meter_error": f"{type(meter.error).__name__}: {meter.error}"}
    times = [t for t, _ in meter.samples]
    gaps = np.diff(times)
    return {"meter_updates": len(times), "meter_gap_ms": float(1e3 * np.median(gaps)) if len(gaps) else None,
            "meter_polls": meter.polls, "meter_unplaced": meter.unplaced}


def judged_by_meter(trace, meter: CounterMeter | None, t0: float):
    """`trace` (its clock from `t0`, the meter's clock) with the board's energy as `meter` read it
    at each tick (`board_energy_mj`, by which flashwatt.control.metrics judges the windows), where
    the meter ran and placed two updates or more."""
    if meter is not None and meter.error is None and len(meter.samples) >= 2 and len(trace):
        trace["board_energy_mj"] = meter.energy_at(trace["t"].to_numpy(dtype=float) + t0)
    return trace
