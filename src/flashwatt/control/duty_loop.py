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
        error = (setpoint_w - power_w) / self.plant_gain_w
        base = self.duty if feed_forward is None else feed_forward
        if feed_forward is None:
            # no table yet: act incrementally on the current duty (integral folded in)
            raw = base + 0.25 * error
            self.integral = 0.0
        else:
            # A jump of the feed-forward (a budget step, another configuration) acts alone for
            # two ticks: the sensor still shows the power from before it, and a proportional
            # kick on that stale error is what would overshoot.
            if self._hold > 0:
                self._hold -= 1
                self.duty = min(self.d_max, max(self.d_min, base + self.integral))
                return self.duty
            raw = base + self.kp * error + self.integral + self.ki * dt * error
            clipped_high = raw >= self.d_max and error > 0
            clipped_low = raw <= self.d_min and error < 0
            if not (clipped_high or clipped_low):
                self.integral += self.ki * dt * error
        # Rise at most max_rise per tick, fall at once: over budget costs more than under it,
        # and the sensor shows a rise one update late.
        raw = min(raw, self.duty + self.max_rise)
        self.duty = min(self.d_max, max(self.d_min, raw))
        return self.duty
