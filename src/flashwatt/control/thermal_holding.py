"""Holding a temperature limit alongside the power budget: a cascade that lowers the power the
pacing loop aims at while the GPU runs hot.

The GPU's temperature follows its power slowly (a time constant of tens of seconds; about
0.05-0.12 degC per watt above ambient on the boards this was tuned for), while the pacing
loop holds a power set point within a few tenths of a second. So the temperature loop sets
a power cap, and the budget the pacing loop holds is the lesser of the user's budget and
that cap (`Governor.held_w`):

    e   = (limit - AIM_BELOW_C) - (T + PREDICT_S x dT/dt)   (dT/dt >= 0 while over limit + 1 degC)
    cap = I + KP x e,   I += KI x e x dt   (I within [floor, budget]; no integration while clipped)

- The temperature is predicted PREDICT_S ahead along its slope over the last SLOPE_S: the
  power that heats the board is cut before the limit is reached, not after (a first-order
  plant approached at full budget otherwise overshoots by several degrees), and a board
  that has cooled to the limit gets its power back before it cools further under it (while
  it is still over the limit a falling slope is not counted: it cools as fast as it can).
- The gains were chosen on a first-order thermal model (tests/control_plant.py) with the
  gain per watt and the time constant each varied 1.5x either way, NVML's whole-degree
  readings and their noise: every 1 s window within limit + 1 degC once it was reached,
  and the power held within 3% of what holds the limit.
- A board that starts hot (over the limit) has its cap driven down to the floor (idle
  power plus FLOOR_ABOVE_IDLE_W): the fastest cooling a workload's side can give; the
  cap climbs back as the temperature comes down.
- Without a temperature reading (NVML failing) the cap holds where it was.

Nothing here touches a device setting: the cap is a set point for the pacing loop.
"""
from __future__ import annotations

import collections

KP_W_PER_C = 40.0
KI_W_PER_C_S = 8.0
PREDICT_S = 5.0
SLOPE_S = 2.0
AIM_BELOW_C = 0.5
FLOOR_ABOVE_IDLE_W = 10.0
# Judged: a 1 s window's mean temperature at or below the limit plus this.
TEMP_TOLERANCE_C = 1.0


class ThermalLimit:
    """The temperature loop of one GPU (module docstring)."""

    def __init__(self, limit_c: float, floor_w: float, ceiling_w: float):
        self.limit_c = float(limit_c)
        self.floor_w = float(floor_w)
        self.ceiling_w = float(ceiling_w)
        self.integral_w = float(ceiling_w)
        self.cap_w = float(ceiling_w)
        self.predicted_c: float | None = None
        self._history: collections.deque = collections.deque()  # (t, temperature)
        self._last_t: float | None = None

    def set_ceiling(self, watts: float) -> None:
        """The user's budget moved: the cap never exceeds it, and climbs to it when cool."""
        was_at_ceiling = self.integral_w >= self.ceiling_w - 1e-9
        self.ceiling_w = float(watts)
        if was_at_ceiling or self.integral_w > self.ceiling_w:
            self.integral_w = self.ceiling_w
        self.cap_w = min(self.cap_w, self.ceiling_w) if not was_at_ceiling else self.ceiling_w

    def slope_c_per_s(self) -> float:
        """The temperature's slope over the last SLOPE_S (0 until that much history)."""
        if len(self._history) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._history[0], self._history[-1]
        return (c1 - c0) / (t1 - t0) if t1 - t0 >= 0.5 * SLOPE_S else 0.0

    def update(self, t: float, temp_c: float | None) -> float:
        """Take one reading; the power cap from now (held where it was without a reading)."""
        if temp_c is None:
            return self.cap_w
        dt = 0.1 if self._last_t is None else max(1e-3, t - self._last_t)
        self._last_t = t
        self._history.append((t, float(temp_c)))
        while self._history and self._history[0][0] < t - SLOPE_S - 1e-9:
            self._history.popleft()
        slope = self.slope_c_per_s()
        if temp_c > self.limit_c + TEMP_TOLERANCE_C:
            slope = max(0.0, slope)  # over the limit: cool as fast as it can, whatever the trend
        self.predicted_c = float(temp_c) + PREDICT_S * slope
        error = (self.limit_c - AIM_BELOW_C) - self.predicted_c
        raw = self.integral_w + KP_W_PER_C * error
        clipped = (raw >= self.ceiling_w and error > 0) or (raw <= self.floor_w and error < 0)
        if not clipped:
            self.integral_w += KI_W_PER_C_S * error * dt
        self.integral_w = min(self.ceiling_w, max(self.floor_w, self.integral_w))
        self.cap_w = min(self.ceiling_w, max(self.floor_w, raw))
        return self.cap_w

    @property
    def binding(self) -> bool:
        """Whether the cap is under the budget (the temperature limit, not the budget, holds power)."""
        return self.cap_w < self.ceiling_w - 1e-6
