"""Time-sharing two duties in place of one between them (`Controller(pace_mix=(low, period_s))`).

The static front between two of its points is their time-sharing: a share of the time at one,
the rest at the other. A paced board at one duty between them sits under that line where its
power curve bends, as near the cap on an H200: one duty near full runs its busy phases over
the cap's clocks and averages the cap. Measured there (`sdpa_cudnn`, the seed's stream), full
duty and duty 0.7 alternated every 0.25-0.5 s drew the tokens of duty 0.85 for 29-37 W less
than duty 0.85 itself (docs/control.md, "Time-sharing two paced points").

A `DutyMix` stands between the governor's duty and the pacer: for a duty `d` between `low` and
full it answers full duty for a share `(d - low) / (1 - low)` of each period and `low` for the
rest, so the busy share over a period is `d` and the loop, its tables and its windows go on in
terms of `d`; its power is the line between the two points' powers. Under `low`, or at full
duty, it answers `d` itself. The phase is read from the clock, so the share follows a duty that
moves within a period at once. A period must fit whole in the readings' windows: the
controller reads the energy counter over two periods (flashwatt.control.counter_power), as it
does a step's pacing cycles.
"""
from __future__ import annotations

from typing import Callable


class DutyMix:
    def __init__(self, duty: Callable[[], float], low: float, period_s: float, clock: Callable[[], float]):
        if not 0.0 < low < 1.0:
            raise ValueError(f"the lower duty must lie in (0, 1), got {low}")
        if period_s <= 0.0:
            raise ValueError(f"the period must be positive, got {period_s} s")
        self.duty, self.low, self.period_s, self.clock = duty, low, period_s, clock
        # How far the GPU runs behind the host when a full phase ends (the work queued then,
        # as the pacer finds it drained): the host ends the full phase that much early, so the
        # GPU's ends on time.
        self.lag_s = 0.0

    def full_share(self, duty: float) -> float:
        """The share of a period at full duty for the busy share `duty` (0 under `low`)."""
        if duty <= self.low:
            return 0.0
        return min(1.0, (duty - self.low) / (1.0 - self.low))

    def drained(self, seconds: float) -> None:
        """The pacer drained `seconds` of work queued in a full phase where the low one began."""
        self.lag_s += 0.3 * (min(seconds, 0.5 * self.period_s) - self.lag_s)

    def _phases(self) -> tuple[float, float] | None:
        """(start of the low phase on the GPU, end of the period) where the host is in a low
        phase now, else None."""
        duty, now = self.duty(), self.clock()
        if duty <= self.low or duty >= 1.0:
            return None
        period_start = now - now % self.period_s
        low_start = period_start + self.full_share(duty) * self.period_s
        if now < low_start - self.lag_s:
            return None
        return low_start, period_start + self.period_s

    def low_since(self) -> float | None:
        """When the GPU's low phase began, or begins once the queue has drained (the clock's
        time), or None outside one: the pacer owes idle for the GPU's work from then on."""
        phases = self._phases()
        return phases[0] if phases else None

    def phase_ends(self) -> float | None:
        """When the low phase in force ends (the next period's start), or None outside one: a
        sleep that pays its idle stops there, or the full phase would begin idle."""
        phases = self._phases()
        return phases[1] if phases else None

    def __call__(self) -> float:
        duty = self.duty()
        if duty <= self.low or duty >= 1.0:
            return duty
        return self.low if self._phases() else 1.0
