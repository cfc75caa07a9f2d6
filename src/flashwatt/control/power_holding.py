"""How the controller moves the duty to hold the budget, beyond the pacing loop's own
steps: where a configuration starts (bumpless, within the power bound), the feed-forward
from the running configuration's duty -> power table (scaled by the share of its watts the
board draws now, less the others' watts: flashwatt.control.table_error), what the loop aims
at, the cut of a reading far over the budget, and the duty after a budget step.

What the loop aims at is the set point less what the budget's 1 s windows, as the energy
counter measures them, will hold beyond the board's power: energy a window already drew
over its budget; a stalled read of the counter (the windows starting there count a tick
twice); after a step down, the counter's lag (the windows starting then hold some of the
power from before); after a switch to another table, a margin for that table's unknown
error, fading over a second; on a budget falling in a ramp, how far it falls before the duty
set now shows in the board's power.

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's model,
loop, set point, others' watts and clock.
"""
from __future__ import annotations

import math

from flashwatt.control.budget_schedule import STEP_MIN_W
from flashwatt.control.configuration import Configuration
from flashwatt.control.model import DUTY_BINS
from flashwatt.control.power_bound import PRIOR_EXPONENT, bounded_duty, prior_duty

# A reading this far over the budget and CUT_SIGMAS standard deviations of a reading's
# noise (flashwatt.control.reading_noise), or two in a row CUT_SIGMAS_TWICE over it, is a
# disturbance, cut at once (Governor._cut_overshoot); one reading less far over is noise
# the loop averages.
OVERSHOOT_CUT = 0.02
CUT_SIGMAS = 4.0
CUT_SIGMAS_TWICE = 2.5
# Energy drawn over the budget in the last second is repaid over this long, by at most this
# share of the budget (Governor._aim_w).
DEBT_REPAY_S = 0.5
DEBT_MAX = 0.15
# Readings this soon after a budget step or a switch still show the power from before it.
STALE_AFTER_CHANGE_S = 0.25
# A read of the energy counter that moved by less than this share of the idle power's energy
# in a tick while the readings showed more than STALL_ABOVE_IDLE x the idle power: the
# counter stalled, and the next read catches up (on the H100: 6 in 898 reads, 5 of them in
# one run). Every 1 s window starting at the stalled read then counts a tick's energy twice,
# so for the next second the loop aims that much lower (Governor._aim_w).
STALL_SHARE = 0.5
STALL_ABOVE_IDLE = 1.2
# The feed-forward goes at most this far past the highest duty a table has seen.
EXTRAPOLATE_DUTY = 0.1
# After a switch to another table, the aim is lower by this share of the watts above idle,
# fading over this long (Governor._aim_w).
FRESH_TABLE_MARGIN = 0.05
FRESH_TABLE_S = 1.0
# On a budget falling in a ramp (changes under STEP_MIN_W, each lower than the last), the aim
# is lower by the ramp's fall over this long: the duty set at a tick draws over the next
# tick and shows in power about a tick after that, while the budget goes on falling (on the
# simulated H100, a ramp of 150 W/s put a 1 s window 3-5% over its time-averaged budget).
RAMP_LEAD_S = 0.2


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
            # The table holds our own watts (scaled by the share the board draws now);
            # offset_w the rest (another tenant). Start where our watts plus those meet the
            # set point; the feed-forward keeps the same compensation from then on.
            duty = self.table_duty(table, room)
            lowest = table.extrapolated_power(self.loop.d_min, self.idle_w)
            if duty is not None and self.unseen(table, duty):
                # (its line from idle is no guide there: table_error.UNSEEN_SHARE)
                del self.model.power[(shape, config)]
                self._events.append(f"{config.label}: its table has seen no duty near {duty:.2f}, learned afresh")
                duty = None  # (started by the power prior below, as a configuration never seen)
            if duty is not None:
                if lowest is not None and self.idle_w + self.table_share * (lowest - self.idle_w) > room:
                    return False
                self._quiet_since = self._fresh_table_t = self.clock()
                self._move_share()
                duty = self.table_duty(table, room)
                self.loop.reset(min(duty, self._feed_forward(table) or duty))
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
        """The duty at which our table, scaled by the share the board draws now, draws what
        the loop aims at less the watts of others; past the highest duty the table has seen,
        at most EXTRAPOLATE_DUTY further (its line from idle there may be far off, as near
        the cap, where power stops rising): the table learns the new duty first."""
        watts = self._aim_w() - max(0.0, self.offset_w)
        duty = self.table_duty(table, watts)
        if duty is None or not table.bins:
            return duty
        # (the power prior's duty is safe anywhere: it predicts more watts than any curve measured)
        prior = prior_duty(watts, self.idle_w, self.limit_w, self.loop.d_min, self.loop.d_max)
        return min(duty, max(max(table.bins) / DUTY_BINS + EXTRAPOLATE_DUTY, prior))

    def _aim_w(self) -> float:
        """What the loop aims at: the set point, less the energy the last second drew over its
        budget, repaid over DEBT_REPAY_S (a tenant that arrived, a step the loop met a tick
        late): the budget is judged by 1 s averages, and the rest of the window can still
        keep this one within it. At most DEBT_MAX of the budget: a larger excess is a tenant
        no one can offset (the windows it makes are infeasible), not a debt to repay. Right
        after a switch to another table (a configuration, a mix of shapes starting or
        ending), also less FRESH_TABLE_MARGIN of the watts above idle, fading over
        FRESH_TABLE_S: that table's error at this moment is not known yet (on the H100 a
        table learned in an earlier run was off by 4-8%), and the share learns it meanwhile."""
        aim = self.setpoint_w - min(DEBT_MAX * self.budget_w, self._debt_j / DEBT_REPAY_S)
        now = self.clock()
        # (each 1 s window starts at one read: the largest excess of any is the saving needed)
        aim -= max((joules for t, joules in self._held_back if now - t < 1.0), default=0.0)  # over 1 s: J are W
        aim -= self._ramp_lead_w(now)
        since = now - self._fresh_table_t
        if self.idle_w is not None and since < FRESH_TABLE_S:
            aim -= FRESH_TABLE_MARGIN * max(0.0, self.setpoint_w - self.idle_w) * (1.0 - since / FRESH_TABLE_S)
        return aim

    def _ramp_lead_w(self, now: float) -> float:
        """How far a budget falling in a ramp falls over RAMP_LEAD_S, at the pace of its last
        change (a change under a step, lower than the budget before, the next one due: the
        first change after a long constant budget leads by little). Rising ramps are followed,
        not led: the budget may stop at any change."""
        if len(self._budget_log) < 2:
            return 0.0
        (t1, b1), (t2, b2) = self._budget_log[-2], self._budget_log[-1]
        if not math.isfinite(t1) or t2 <= t1 or not 0.0 < b1 - b2 < STEP_MIN_W or now - t2 > 1.5 * (t2 - t1):
            return 0.0
        return (b1 - b2) / (t2 - t1) * RAMP_LEAD_S

    def _counter_joules(self, now: float, energy_mj: float | None, power: float | None) -> float | None:
        """The energy counter's joules, a stalled read (STALL_SHARE) replaced by the readings'
        estimate until the counter catches up; a stall is remembered for _aim_w."""
        if energy_mj is None:
            return None
        joules = energy_mj / 1e3
        last, self._counter_last = self._counter_last, (now, joules)
        if last is None or self.idle_w is None or now <= last[0]:
            return joules + self._stall_j
        dt = now - last[0]
        level = self.power_filtered if self.power_filtered is not None else power
        if self._stall_j and joules - last[1] > (level or 0.0) * dt + 0.5 * self._stall_j:
            self._stall_j = 0.0  # caught up
        elif joules - last[1] < STALL_SHARE * self.idle_w * dt and power is not None \
                and power > STALL_ABOVE_IDLE * self.idle_w:
            self._stall_j += power * dt
            self._stalls.append((now, power * dt))
            self._held_back.append((now, power * dt))
            self._events.append(f"energy counter stalled: {power * dt:.0f} J held back for 1 s")
        return joules + self._stall_j

    def _update_debt(self, now: float) -> None:
        window = [(t, j) for t, j, _ in self._energy if t >= now - 1.0 - 1e-9]
        if len(window) < 2 or window[-1][0] - window[0][0] < 0.9:
            self._debt_j = 0.0
            return
        allowed = self._allowed_j(window[0][0], window[-1][0])
        self._debt_j = max(0.0, (window[-1][1] - window[0][1]) - allowed)

    def _allowed_j(self, start: float, end: float) -> float:
        """The energy the budget allows from `start` to `end`: each budget for the time it was
        in force, as the windows are judged (flashwatt.control.metrics.window_budget). Read
        tick by tick instead, a step down between two ticks charged the energy drawn before it
        at the new budget: a debt the board never ran up, repaid over the next half second
        (on the H100, 40-55 W under the budget after a step from 496 to 261 W)."""
        changes = [(t, b) for t, b in self._budget_log if t < end]
        if not changes:
            return (self.budget_w or 0.0) * (end - start)
        total, budget, since = 0.0, changes[0][1], start
        for t, b in changes:
            if t > start:
                total += budget * (t - since)
                since = t
            budget = b
        return total + budget * (end - since)

    def _running_table(self):
        """The duty -> power table of what runs now: the running (shape, configuration)'s, or
        the mix's while several shapes share the GPU."""
        if self._several_shapes:
            return self.model.mix_power if self.model.mix_power.bins else None
        running = self._running()
        return self.model.power.get(running) if running is not None else None

    def _over_budget(self, power: float) -> bool:
        """Whether a reading is over the budget beyond the readings' noise: CUT_SIGMAS
        deviations, or CUT_SIGMAS_TWICE in this reading and the one before."""
        sigma = self.noise.sigma_w(self.power_filtered if self.power_filtered is not None else power)
        base = self.budget_w * (1 + OVERSHOOT_CUT)
        twice = self._last_reading is not None and min(power, self._last_reading) > base + CUT_SIGMAS_TWICE * sigma
        self._last_reading = power
        return power > base + CUT_SIGMAS * sigma or twice

    def _prior_cut(self, power: float, ran: float) -> float:
        """The duty at which the power prior's curve, through `power` read at the duty `ran`,
        meets the set point: more of a cut than any measured curve needs."""
        return ran * (max(0.0, self.setpoint_w - self.idle_w) / (power - self.idle_w)) ** (1 / PRIOR_EXPONENT)

    def _cut_overshoot(self, power: float, table, ran: float) -> None:
        """A reading over the budget beyond the readings' noise (CUT_SIGMAS deviations, or two
        in a row CUT_SIGMAS_TWICE): a tenant arrived or a table is wrong, and the duty that
        meets the set point is set now, not after the loop's averaging. With a table, every
        watt it does not explain is taken as another tenant's (flashwatt.control.table_error;
        the feed-forward then holds the duty); without one, the power prior's curve cuts
        (more than any measured curve needs)."""
        if self.idle_w is None or power <= self.idle_w or not self._over_budget(power):
            return
        if self._just_changed():
            return  # a step or a switch just moved the duty: this reading is from before it
        # (at the duty the reading was drawn at: the loop has just moved it, on a tenant's
        # step taken from this very reading to meet the others' watts; read at the new duty,
        # the same watts were taken twice, 390 W for a tenant of 150 W)
        ours = self.table_power(table, ran)
        if ours is not None:
            excess = power - ours - self.offset_w
            if excess > 0:
                self._take_step(excess, ours)
            duty = self._feed_forward(table)
        else:
            duty = self._prior_cut(power, ran)
        if duty is None or duty >= self.loop.duty:
            return
        self.loop.reset(duty)
        self._events.append(f"cut: {power:.0f} W over the budget, duty {self.loop.duty:.2f}")

    def _retarget(self) -> None:
        """After a budget step with no switch: the duty for the new set point now, not a tick
        later. From the running configuration's table (scaled by the share); on a step
        down, never above what the power prior's curve gives from where power is now (it
        cuts more than any measured curve needs), so a table that is wrong there, or a mix of
        shapes whose table is thin, cannot keep power over the new budget for the hold."""
        if self.mode != "budget" or self.idle_w is None:
            return
        aim = self._aim_w() - max(0.0, self.offset_w)
        candidates = []
        ff = self._feed_forward(self._running_table())
        if ff is not None:
            candidates.append(ff)
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

