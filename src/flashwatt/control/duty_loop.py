"""The pacing loop: a PI controller on the duty cycle that holds measured power at a set point.

Plant: duty d in [d_min, 1] -> board power, a lag of about one NVML update (0.1 s) and a
cap that clips at the enforced power limit. The loop runs once per sensor tick:

    d = feed_forward(set point) + Kp * e + I,   I += Ki * e * dt,   e = set point - power

The feed-forward is the duty the configuration's duty -> power table says draws the set
point (flashwatt.control.model.PowerTable), so a budget step lands near its new duty in one
tick and the integral only removes what the table got wrong. Gains are normalised by the
plant's gain (watts per unit duty, about limit - idle), so one tuning serves any board.
Anti-windup: the integral stops growing while the output is clipped in the direction the
error pushes, and while a feed-forward step acts alone (below).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DutyLoop:
    plant_gain_w: float  # watts per unit of duty, about (power at full duty - idle)
    kp: float = 0.5
    ki: float = 3.0  # per second
    max_rise: float = 0.15  # duty per tick
    k_climb: float = 0.35  # without a table: duty per unit of error (normalised by the plant's gain), per tick
    d_min: float = 0.05
    d_max: float = 1.0
    integral: float = 0.0
    duty: float = 1.0
    _hold: int = 0  # ticks left in which a feed-forward step acts alone

    def reset(self, duty: float | None = None) -> None:
        self.integral = 0.0
        if duty is not None:
            self.duty = min(self.d_max, max(self.d_min, duty))

    def hold(self, ticks: int = 2) -> None:
        """The set point or the configuration just changed: let the feed-forward act alone."""
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
