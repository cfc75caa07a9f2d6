"""The pacing loop: the duty cycle that holds the board's power at what the governor aims at.

Plant: duty d in [d_min, 1] -> board power, following within about 30 ms, read by NVML's
instant field with about a tenth of the watts above idle of noise per reading, white (on an
H100; tests/control_plant.py holds the fit), and a cap that clips at the enforced limit.
The loop runs once per sensor tick.

With a duty -> power table for what runs (flashwatt.control.model.PowerTable), the duty is
the table's for what the governor aims at, read through the governor's estimate of what the
table misses (flashwatt.control.table_error: the share of the table's watts the board draws
now, and other tenants' watts), learned from the energy counter and the readings averaged
over about half a second. That estimate is the loop's integral action: one reading's noise
does not move the duty, and a budget step, a switch or a tenant's step moves it at once,
up as down. (The loop this replaced acted on each reading, cut on any reading over the
budget and rose at most 0.15 per tick: on the H100 it cut on 14% of its ticks, its duty swung
from 0.14 to 0.55 at a constant budget and its power averaged 91% of the budget.)

Without a table yet (a configuration's first ticks), the loop acts incrementally on the
current duty, by k_climb of the error normalised by the plant's gain (watts per unit duty,
about limit - idle), rising at most max_rise per tick and falling at once.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DutyLoop:
    plant_gain_w: float  # watts per unit of duty, about (power at full duty - idle)
    kp: float = 0.5  # kept for callers that set it; the feed-forward path does not use it
    ki: float = 3.0  # per second; as kp
    max_rise: float = 0.15  # duty per tick
    k_climb: float = 0.35  # without a table: duty per unit of error (normalised by the plant's gain), per tick
    d_min: float = 0.05
    d_max: float = 1.0
    integral: float = 0.0
    duty: float = 1.0
    _hold: int = 0  # kept for callers that set it (hold()); the feed-forward path acts at once

    def reset(self, duty: float | None = None) -> None:
        self.integral = 0.0
        if duty is not None:
            self.duty = min(self.d_max, max(self.d_min, duty))

    def hold(self, ticks: int = 2) -> None:
        """The set point or the configuration just changed (kept for callers: the duty
        already follows the feed-forward at once)."""
        self._hold = ticks

    def update(self, setpoint_w: float, power_w: float, dt: float, feed_forward: float | None) -> float:
        if feed_forward is not None:
            # The table (scaled by what the board draws now) gives the duty: the integral
            # action is the governor's estimate of what the table misses
            # (flashwatt.control.table_error), learned from readings averaged over a second,
            # so a reading's noise does not move the duty and a step moves it at once, up or down.
            self.integral = 0.0
            self._hold = 0
            self.duty = min(self.d_max, max(self.d_min, feed_forward))
            return self.duty
        # No table yet: act incrementally on the current duty, rising at most max_rise per
        # tick (the sensor shows a rise one update late), falling at once.
        error = (setpoint_w - power_w) / self.plant_gain_w
        raw = min(self.duty + self.k_climb * error, self.duty + self.max_rise)
        self.integral = 0.0
        self.duty = min(self.d_max, max(self.d_min, raw))
        return self.duty
