"""The pacing loop: a PI controller on the duty cycle that holds measured power at a set point.

Plant: duty d in [d_min, 1] -> board power, a lag of about one NVML update (0.1 s) and a
cap that clips at the enforced power limit. The loop runs once per sensor tick:

    d = feed_forward(set point) + Kp * e + I,   I += Ki * e * dt,   e = set point - power

The feed-forward is the duty the configuration's duty -> power table says draws the set
point (flashwatt.control.model.PowerTable), so a budget step lands near its new duty in one
tick and the integral only removes what the table got wrong. Gains are normalised by the
plant's gain (watts per unit duty, about limit - idle), so one tuning serves any board.
Anti-windup: the integral stops growing while the output is clipped in the direction the
error pushes, and for the first ticks of a large error (the sensor still shows the power
before a step); a large error that persists (a disturbance) is integrated.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DutyLoop:
    plant_gain_w: float  # watts per unit of duty, about (power at full duty - idle)
    kp: float = 0.35
    ki: float = 2.0  # per second
    integrate_within: float = 0.1  # |error| / plant gain under which the integral acts
    d_min: float = 0.05
    d_max: float = 1.0
    integral: float = 0.0
    duty: float = 1.0
    _large: int = 0  # consecutive ticks with a large error

    def reset(self, duty: float | None = None) -> None:
        self.integral = 0.0
        if duty is not None:
            self.duty = min(self.d_max, max(self.d_min, duty))

    def update(self, setpoint_w: float, power_w: float, dt: float, feed_forward: float | None) -> float:
        error = (setpoint_w - power_w) / self.plant_gain_w
        base = self.duty if feed_forward is None else feed_forward
        if feed_forward is None:
            # no table yet: act incrementally on the current duty (integral folded in)
            raw = base + (self.kp * 0.5 + self.ki * dt) * error
            self.integral = 0.0
        else:
            raw = base + self.kp * error + self.integral + self.ki * dt * error
            clipped_high = raw >= self.d_max and error > 0
            clipped_low = raw <= self.d_min and error < 0
            # Integrate only near the set point: a large error right after a step is the
            # sensor's lag, which the feed-forward and the proportional term already answer.
            self._large = self._large + 1 if abs(error) >= self.integrate_within else 0
            lagging = 0 < self._large < 3
            if not (clipped_high or clipped_low or lagging):
                self.integral += self.ki * dt * error
        self.duty = min(self.d_max, max(self.d_min, raw))
        return self.duty
