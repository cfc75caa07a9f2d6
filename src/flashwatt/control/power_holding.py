"""How the controller moves the duty to hold the budget, beyond the pacing loop's own
steps: where a configuration starts (bumpless, within the power bound), the feed-forward
from the running configuration's duty -> power table less the others' watts, what the loop
aims at (the set point less energy a window drew over its budget), the cut of a reading
over the budget, and the duty after a budget step.

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's model,
loop, set point, others' watts and clock.
"""
from __future__ import annotations

import statistics

from flashwatt.control.configuration import Configuration
from flashwatt.control.power_bound import PRIOR_EXPONENT, bounded_duty, prior_duty

# A reading this far over the budget (and three times the readings' noise, up to
# NOISE_ALLOWANCE of the budget) is cut at once (Governor._cut_overshoot); the noise is
# estimated from deviations of at most NOISE_CLIP_W.
OVERSHOOT_CUT = 0.02
NOISE_CLIP_W = 20.0
NOISE_ALLOWANCE = 0.03  # of the budget, at most, for the readings' noise
# Energy drawn over the budget in the last second is repaid over this long, by at most this
# share of the budget (Governor._aim_w).
DEBT_REPAY_S = 0.5
DEBT_MAX = 0.15
# Readings this soon after a budget step or a switch still show the power from before it.
STALE_AFTER_CHANGE_S = 0.25


class PowerHolding:
    """The governor's moves of the duty (module docstring)."""

    def _start_duty(self) -> float:
        """The duty the power prior gives for the set point less the others' watts
        (flashwatt.control.power_bound): measured curves are concave, and the prior more so,
        so this starts under budget."""
        if self.idle_w is None:
            share = self.setpoint_w / (self.loop.plant_gain_w + 100.0)
            return min(self.loop.d_max, max(self.loop.d_min, 0.5 * share))
        return prior_duty(self.setpoint_w - max(0.0, self.offset_w), self.idle_w, self.limit_w, self.loop.d_min,
                          self.loop.d_max)

    def _duty_for_switch(self, shape: tuple, config: Configuration) -> bool:
        """Bumpless for power: a configuration starts at the duty its own table gives for the
        set point, or, never seen, at the duty the power prior bounds. False (and nothing
        changed) where even the lowest duty is predicted over the set point."""
        if self.mode != "budget":
            return True
        room = self.setpoint_w - max(0.0, self.offset_w)
        table = self.model.power.get((shape, config))
        if table is not None and self.idle_w is not None:
            # The table holds our own watts; offset_w the rest (another tenant, the table's
            # error). Start where our watts plus those meet the set point; the feed-forward
            # keeps the same compensation after the hold, and the integral keeps any
            # difference, so neither the switch nor the end of the hold drops it.
            duty = table.duty_for(room, self.idle_w)
            ff = self._feed_forward(table)
            lowest = table.extrapolated_power(self.loop.d_min, self.idle_w)
            if duty is not None:
                if lowest is not None and lowest > room:
                    return False
                self._quiet_since = self.clock()
                self.loop.reset(duty)
                self.loop.integral = self.loop.duty - ff if ff is not None else 0.0
                self.loop.hold()
                return True
        if self.idle_w is None:
            duty = min(self.loop.duty, self._start_duty())
        else:
            duty = bounded_duty(self.model, (shape, config), room, self.idle_w, self.limit_w, self.loop.d_min,
                                self.loop.d_max)
            if duty is None:
                return False
        self._quiet_since = self.clock()
        self.loop.reset(duty)
        self.loop.hold()
        return True

    def _just_changed(self) -> bool:
        """A budget step or a switch moved the duty so recently that readings still show the
        power from before it."""
        return self._quiet_since is not None and self.clock() - self._quiet_since < STALE_AFTER_CHANGE_S

    def _feed_forward(self, table) -> float | None:
        """The duty at which our table draws what the loop aims at less the watts of others."""
        if table is None or self.idle_w is None:
            return None
        return table.duty_for(self._aim_w() - max(0.0, self.offset_w), self.idle_w)

    def _aim_w(self) -> float:
        """What the loop aims at: the set point, less the energy the last second drew over its
        budget, repaid over DEBT_REPAY_S (a tenant that arrived, a step the loop met a tick
        late): the budget is judged by 1 s averages, and the rest of the window can still
        keep this one within it. At most DEBT_MAX of the budget: a larger excess is a tenant
        no one can offset (the windows it makes are infeasible), not a debt to repay."""
        return self.setpoint_w - min(DEBT_MAX * self.budget_w, self._debt_j / DEBT_REPAY_S)

    def _update_debt(self, now: float) -> None:
        window = [(t, j, b) for t, j, _, b in self._energy if t >= now - 1.0 - 1e-9]
        if len(window) < 2 or window[-1][0] - window[0][0] < 0.9:
            self._debt_j = 0.0
            return
        seconds = window[-1][0] - window[0][0]
        allowed = statistics.fmean(b for _, _, b in window[1:]) * seconds
        self._debt_j = max(0.0, (window[-1][1] - window[0][1]) - allowed)

    def _running_table(self):
        """The duty -> power table of what runs now: the running (shape, configuration)'s, or
        the mix's while several shapes share the GPU."""
        if self._several_shapes:
            return self.model.mix_power if self.model.mix_power.bins else None
        running = self._running()
        return self.model.power.get(running) if running is not None else None

    def _cut_overshoot(self, power: float, table) -> None:
        """A reading over the budget, beyond the readings' noise (another tenant arrived, a
        table was wrong): the duty that meets the set point now, not after the loop's ticks. From the configuration's
        table, taking every watt it does not explain as another tenant's; without one, by
        the power prior's curve (which cuts more than any measured curve needs)."""
        threshold = self.budget_w * (1 + OVERSHOOT_CUT) + min(3.0 * self._noise_w, NOISE_ALLOWANCE * self.budget_w)
        if self.idle_w is None or power <= threshold or power <= self.idle_w:
            return
        if self._just_changed():
            return  # a step or a switch just moved the duty: this reading is from before it
        ours = table.power_at(self.loop.duty, self.idle_w) if table is not None else None
        if ours is not None:
            duty = table.duty_for(self.setpoint_w - (power - ours), self.idle_w)
            ff = self._feed_forward(table)
        else:
            duty = self.loop.duty * (max(0.0, self.setpoint_w - self.idle_w) / (power - self.idle_w)) ** (1 / PRIOR_EXPONENT)
            ff = None
        if duty is None or duty >= self.loop.duty:
            return
        self.loop.reset(duty)
        self.loop.integral = self.loop.duty - ff if ff is not None else 0.0
        self.loop.hold(1)  # the next reading may still show power from before the cut
        self._events.append(f"cut: {power:.0f} W over the budget, duty {self.loop.duty:.2f}")

    def _retarget(self) -> None:
        """After a budget step with no switch: the duty for the new set point now, not a tick
        later. From the running configuration's table (the loop's integral kept); on a step
        down, never above what the power prior's curve gives from where power is now (it
        cuts more than any measured curve needs), so a table that is wrong there, or a mix of
        shapes whose table is thin, cannot keep power over the new budget for the hold."""
        if self.mode != "budget" or self.idle_w is None:
            return
        aim = self._aim_w() - max(0.0, self.offset_w)
        candidates = []
        ff = self._feed_forward(self._running_table())
        if ff is not None:
            candidates.append(ff + self.loop.integral)
        else:
            running = self._running()
            if running is not None:
                duty = bounded_duty(self.model, running, aim, self.idle_w, self.limit_w, self.loop.d_min,
                                    self.loop.d_max)
                candidates.append(self.loop.duty if duty is None else duty)
        power = self.power_filtered
        if power is not None and power > self.idle_w and aim < power - max(0.0, self.offset_w):
            ours = power - max(0.0, self.offset_w) - self.idle_w
            share = max(0.0, aim - self.idle_w) / ours if ours > 0 else 0.0
            candidates.append(self.loop.duty * min(1.0, share) ** (1 / PRIOR_EXPONENT))
        if candidates:
            self.loop.duty = min(self.loop.d_max, max(self.loop.d_min, min(candidates)))
            if ff is None:
                self.loop.integral = 0.0

    def _running(self) -> tuple | None:
        """(shape, configuration) running now: the last tick's only shape with its present
        configuration, or the only shape's; None while several shapes share the GPU."""
        if self._several_shapes:
            return None
        if self._last_single is not None:
            shape = self._last_single[0]
            state = self.shapes.get(shape)
            return (shape, state.config if state is not None else self._last_single[1])
        items = list(self.shapes.items())
        return (items[0][0], items[0][1].config) if len(items) == 1 else None

