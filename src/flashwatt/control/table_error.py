"""What the running configuration's duty -> power table does not explain, in two parts: the
board drawing a different share of the table's watts above idle for the same work (its
temperature and clocks drift; a warm start's table is older), and other tenants' watts (an
offset common to every configuration).

Each reading is compared with what the table, scaled by the share, plus the others' watts
predict at the duty that ran: the innovation, in units of one reading's noise
(flashwatt.control.reading_noise; on the H100 about 10% of the watts above idle):

- a step of watts we did not make (a tenant arriving or leaving) is a jump of the innovation:
  one reading TENANT_SIGMAS deviations (and TENANT_STEP_W) off, or a run of readings whose
  cumulative sum (a CUSUM with slack CUSUM_SLACK deviations per reading) passes CUSUM_ALARM.
  It is taken whole into the others' watts at once, and the duty follows through the
  feed-forward (a fall below the others' watts that left goes to the share, which held them
  too; a fall with none on the board is our work pausing inside a step, and passes);
- right after a budget step or a switch a difference is the table's first (TABLE_FIRST_S), but
  no further than a table can be wrong (SHARE_RANGE): what the energy counter measured since
  the change beyond that is a tenant's that arrived with it, taken whole at once (CHANGE_TICKS);
- with no other tenant on the board, the share follows what the energy counter measured over
  the last COUNTER_WINDOW ticks against what the table predicted for the duties that ran
  then (COUNTER_GAIN of the difference per tick): the counter integrates every millisecond,
  so half a second of it knows the board's power to a few watts where half a second of
  readings scatters by 15 W (H100); without a counter, the share follows the readings'
  innovation, SHARE_GAIN of it per reading. Either way a drift of the board is followed
  within a second, and the readings' noise does not move the duty tick by tick;
- while others' watts are on the board they follow it instead (a tenant's load varies), and
  the share holds.

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's noise,
offset, duty and clock.
"""
from __future__ import annotations

from flashwatt.control.model import DUTY_BINS
from flashwatt.control.power_bound import most_power

TENANT_STEP_W = 25.0
TENANT_SIGMAS = 4.0
CUSUM_SLACK = 1.0
CUSUM_ALARM = 3.0
# While either CUSUM is this high, a shift may be building (a small tenant arriving): the share
# waits rather than absorb it (it would then scale our watts at the next budget for them).
CUSUM_HOLD = 2.5
SHARE_GAIN = 0.12
COUNTER_WINDOW = 5
COUNTER_GAIN = 0.3
COUNTER_LAG = 0.45  # of a tick: how far behind the board the counter reads (H100)
# What the tables learn: the counter over this many ticks at one duty (within STILL_DUTY).
LEARN_WINDOW = 3
STILL_DUTY = 0.03
SHARE_RANGE = (0.85, 1.15)
# A tenant seen in a reading had been drawing for about this long (half a tick, the reading's
# window, the board's lag) before the duty could answer it.
ARRIVED_BEFORE_S = 0.15
OTHERS_GAIN = 0.5  # of the innovation per reading, while others' watts are on the board
# For this long after a switch, a budget step or a warm start, a difference is the table's
# (read at a duty or for a configuration it has seen little of; the readings right after the
# change still show the power from before it): the share learns it faster, and only a step
# twice as large is taken for a tenant's.
TABLE_FIRST_S = 1.0
TABLE_FIRST_GAIN = 0.3
# But a table is not wrong by more than SHARE_RANGE allows: what the energy counter measured
# over at least CHANGE_TICKS ticks since the change beyond that (and beyond CHANGE_MARGIN of the
# table's watts above idle: the counter's scatter over 0.2 s, a few % of them on the H100, and
# its read at a change, which swings with the power) is another tenant's, one that arrived with
# the step, taken at once (TableError._tenant_with_change). One tick is not enough: its read
# holds the swing of the change itself.
CHANGE_TICKS = 2
CHANGE_MARGIN = 0.1
# A share is learned where the board runs: a table's error is partly its own at each duty (a
# bin seen in few ticks, pacing at low duty), so after a budget step or a switch only this
# much of the share's distance from one is kept (Governor._move_share).
SHARE_KEPT = 0.5
# Watts above idle a table is read at, at least (the share is a ratio).
MIN_ABOVE_W = 20.0
# A share is known only where the board ran when it was learned. Above that duty the board may
# draw a larger share of the table's watts: on the H200 a share learned at duty ~0.7 was
# 1.1-1.15x too low at 0.95 and more (the curve steepens near the top, and a table's bins
# there came from earlier runs or the chord from idle), which put 1 s windows 5% over a budget
# stepping or ramping up. So the duty is chosen (TableError.table_duty) as if the share grew
# by UNCONFIRMED_PER_DUTY for each unit of duty past CONFIRMED_BAND above the highest duty at
# which the counter or the readings confirmed it (up to CONFIRMED_S before its last lesson).
# The climb is confirmed as it goes (the counter's last LEARN_WINDOW ticks at the higher duty
# move the confirmed duty up, and the caution with it), so the caution covers the error over
# one stage of the climb, not the whole of it: 0.4 per unit of duty, the low end of the H200's
# 0.4-0.6 (1.1-1.15x over 0.25). On the simulated H100 it costs about 0.4% of the held-out
# suite's throughput against the static front (four seeds of the plant); 0.3 let the board of
# tests/test_control_duty_share.py put windows 3.6% over.
UNCONFIRMED_PER_DUTY = 0.4
CONFIRMED_BAND = 0.05  # one bin of a table: the duty moves this much within one operating point
# A table knows its bins, not the stretch between idle and its lowest one, which it reads along
# the line from idle, under a concave curve there: where power above idle grows as duty ** 0.5
# (the power prior's exponent) the line is 15 % under it (the share's range) at three quarters of
# the lowest duty seen, 36 % at a half. A configuration is not started from its table at a duty
# under UNSEEN_SHARE of the table's lowest (power_holding._duty_for_switch): the table is
# learned afresh there. On an H200 a Llama-3-8B prefill table learned at full duty only (695 W,
# an energy-mode run's, through the warm start) read 431 W at duty 0.54 where the board drew
# 588 W: the 160 W were taken for another tenant's at the start of a 450 W run, stayed in the
# others' watts (85-130 W) for all of it, and nothing was learned meanwhile.
UNSEEN_SHARE = 0.75
# How far back from the share's last lesson its duties count: the share drifts over seconds (the
# board's temperature, its clocks); a gap in the readings teaches nothing and keeps them.
CONFIRMED_S = 4.0


class TableError:
    """The governor's estimate of what its tables miss (module docstring)."""

    def _init_table_error(self) -> None:
        self.table_share = 1.0  # the share of the table's watts above idle the board draws now
        self._cusum = [0.0, 0.0]  # (up, down) in deviations
        self._cusum_sum = [0.0, 0.0]  # innovations (watts) summed while each CUSUM is above zero
        self._cusum_n = [0, 0]
        # (t, counter joules, the table's watts above idle unscaled, others' watts, table) per tick
        self._counter_seen: list[tuple] = []
        self._below_last = False  # the last reading showed under half the others' watts
        self._confirmed: list[tuple[float, float]] = []  # (t, duty) where the share was learned

    def table_power(self, table, duty: float) -> float | None:
        """What our configuration draws at `duty` now: its table (past the highest duty seen,
        along the line from idle through it), scaled by the share."""
        expected = table.extrapolated_power(duty, self.idle_w) if table is not None else None
        if expected is None:
            return None
        return self.idle_w + self.table_share * (expected - self.idle_w)

    def table_duty(self, table, watts: float) -> float | None:
        """The duty at which our configuration draws `watts` now (the table, scaled); above the
        duty where the share was confirmed, at most the duty at which the cautious share
        (cautious_power) draws them."""
        if table is None or self.idle_w is None:
            return None
        duty = table.duty_for(self.idle_w + (watts - self.idle_w) / self.table_share, self.idle_w)
        confirmed = self.confirmed_duty()
        if duty is None or confirmed is None:
            return duty
        known = confirmed + CONFIRMED_BAND
        if duty <= known or self.cautious_power(table, known, known) is None:
            return duty
        # (cautious_power grows with the duty and meets the scaled table at `known`, which
        # draws no more than `watts`: the duty sought lies in [known, duty])
        low, high = known, duty
        for _ in range(16):
            middle = 0.5 * (low + high)
            if self.cautious_power(table, middle, known) <= watts:
                low = middle
            else:
                high = middle
        return low

    def cautious_power(self, table, duty: float, known: float) -> float | None:
        """What our configuration may draw at `duty` where the share is confirmed only up to
        the duty `known`: the table scaled by the share, and past `known` by
        UNCONFIRMED_PER_DUTY more of it per unit of duty."""
        expected = table.extrapolated_power(duty, self.idle_w)
        if expected is None:
            return None
        return self.idle_w + self._cautious_share(duty, known) * (expected - self.idle_w)

    def _cautious_share(self, duty: float, known: float) -> float:
        """The share, and UNCONFIRMED_PER_DUTY more of it per unit of duty past `known`."""
        return self.table_share * (1.0 + UNCONFIRMED_PER_DUTY * max(0.0, duty - known))

    def confirmed_duty(self) -> float | None:
        """The highest duty at which the share was learned from the counter or the readings in
        the CONFIRMED_S up to its last lesson (a gap in the readings, where nothing is learned,
        leaves the share as it was learned, over the duties it was learned at); None before
        the run's first lesson (the share is then the tables' own, learned nowhere lower down
        to be carried up)."""
        if not self._confirmed:
            return None
        return max(d for _, d in self._confirmed)

    def _confirm(self, duty: float) -> None:
        """The share was learned (or the readings followed whole) at `duty` now; lessons more
        than CONFIRMED_S older are dropped here, every tick, so the list stays a few dozen long
        in a run of any length."""
        now = self.clock()
        self._confirmed = [(t, d) for t, d in self._confirmed if now - t <= CONFIRMED_S]
        self._confirmed.append((now, duty))

    def unseen(self, table, duty: float) -> bool:
        """Whether `duty` lies under UNSEEN_SHARE of the lowest duty `table` has seen."""
        return table is not None and bool(table.bins) and duty < UNSEEN_SHARE * min(table.bins) / DUTY_BINS

    def _observe(self, power: float, table, steady: bool) -> bool:
        """Take one reading's innovation into the others' watts or the share. Whether the tick
        may be learned from (no step of others' watts being taken in)."""
        if self._beyond_any_curve(power):
            return False
        ours = self.table_power(table, self._ran_duty())
        if ours is None:
            # No table to read ours from: still, two readings in a row with less than half the
            # others' watts above idle say they left (the board draws idle at the least)
            below = self.offset_w > TENANT_STEP_W and power - self.idle_w < 0.5 * self.offset_w
            if below and self._below_last and not self._just_changed():
                self._take_step(-self.offset_w, self.idle_w)
            self._below_last = below
            return True
        # (a tenant's watts scatter as ours do: the noise is that of everything on the board)
        sigma = self.noise.sigma_w(ours + max(0.0, self.offset_w))
        innovation = power - ours - self.offset_w
        table_first = self._quiet_since is not None and self.clock() - self._quiet_since < TABLE_FIRST_S
        # (a mix of shapes changes its watts whenever one shape changes its configuration:
        # only a step twice as large is surely another tenant's there; while the duty moves,
        # or right after a switch, the reading may still show part of what ran before)
        scale = (2.0 if self._several_shapes else 1.0) * (1.0 if steady else 1.5) * (1.5 if table_first else 1.0)
        if table_first:
            tenant = self._tenant_with_change()
            if tenant is not None:
                # (it drew from the change on, not only ARRIVED_BEFORE_S before this reading)
                self._reset_cusum()
                self._take_step(tenant, ours, arrived_s=self.clock() - self._quiet_since)
                return False
        step = self._step(innovation, sigma, scale)
        if step is None and self.offset_w > TENANT_STEP_W and innovation < -0.5 * self.offset_w \
                and self._below_last:
            step = innovation  # two readings in a row without half the others' watts: they left
        self._below_last = self.offset_w > TENANT_STEP_W and innovation < -0.5 * self.offset_w
        if step is not None:
            if not self._just_changed():
                self._take_step(step, ours)
            # (right after a budget step or a switch, a step is the power from before or a
            # tenant's, not yet told apart: neither is learned, and the next readings decide.
            # Learned, a tenant's watts made a table draw 670 W at duty 0.01 on the H100,
            # which held the duty there long after the tenant left.)
            return False
        bounded = max(-3.0 * sigma, min(3.0 * sigma, innovation))
        counted = self._counter_window()
        if self._others_present():
            # their load varies, and faster than the counter's window: follow the readings
            self.offset_w += OTHERS_GAIN * bounded
            if steady:
                # (what the readings show at this duty is followed whole, ours and theirs: a
                # share too low here reads as their watts and the loop answers it, so the duty
                # is confirmed as if the share had been learned; else a tenant on the board
                # kept the caution of an unconfirmed duty for as long as it stayed)
                self._confirm(self._ran_duty())
        elif max(self._cusum) > CUSUM_HOLD:
            pass  # a shift may be building: the step detection decides first
        elif counted is not None:
            if self._follow_share((counted[0] - max(0.0, self.offset_w)) / counted[1], counted[1], ours):
                # (the lowest duty of its last LEARN_WINDOW ticks: the lesson holds for what ran there)
                self._confirm(min(e[5] for e in self._counter_seen[-LEARN_WINDOW:]))
        elif steady and not self._just_changed():
            gain = TABLE_FIRST_GAIN if table_first else SHARE_GAIN
            self._set_share(self.table_share * (1.0 + gain * bounded / max(MIN_ABOVE_W, ours - self.idle_w)))
            self._confirm(self._ran_duty())
        return True

    def _beyond_any_curve(self, power: float) -> bool:
        """Whether this reading holds watts no configuration of ours draws at the duty that
        ran (flashwatt.control.power_bound.most_power, and three deviations of the readings'
        noise): another tenant's, whatever a table says, since a table may have learned them
        (a tenant already running when the run began, or one missed while the duty fell).
        The excess is taken into the others' watts (not in a change's stale readings), and
        nothing of the tick is learned. On the H100 a tenant's watts learned as a table's,
        670 W at duty 0.01, held the duty there long after the tenant left."""
        if self.idle_w is None:
            return False
        # (an instant reading may show the duty of the tick before as much as this one's)
        duty = self._ran_duty() if self._window is not None else max(self.loop.duty, self._prev_duty)
        excess = power - max(0.0, self.offset_w) - most_power(duty, self.idle_w, self.limit_w)
        if excess <= 3.0 * self.noise.sigma_w(power) or excess < TENANT_STEP_W:
            return False
        if not self._just_changed():
            self._reset_cusum()
            self._take_step(excess, power - max(0.0, self.offset_w) - excess)
        return True

    def _tenant_with_change(self) -> float | None:
        """Right after a budget step or a switch (TABLE_FIRST_S), a difference is the table's
        first: but a table is not wrong by more than SHARE_RANGE allows (above the duty where
        the share was confirmed, by more than the caution of UNCONFIRMED_PER_DUTY), so what the
        energy counter measured since the change beyond that, and beyond the counter's scatter
        (CHANGE_MARGIN of the watts above idle, TENANT_STEP_W at least), is another tenant's:
        one that arrived with the change. The size of the step, in watts: what the counter's
        last tick shows over the table at the share as it is (all of that tick is after the
        change: the counter lags it by less than a tick), at least the excess found; None
        where nothing is beyond the table's error.

        The counter, not the readings: over CHANGE_TICKS ticks it knows the board's watts to a
        few % of those above idle where one reading scatters by 10%, so a tenant that arrives
        with a step is told from the table's error 0.2 s after it; and it is read against the
        duties that ran in each tick, the one before the change included (COUNTER_LAG), so the
        power from before a step down is not taken for a tenant. Before, on the H200 (random-
        4141-12) and on the simulated H100 (tests/test_control_tenant_with_step.py), the share
        took a tenant's watts for the table's for as long as a second after the step, and its
        1 s windows went 3-10% over the budget."""
        since = self._quiet_since
        # (the tick at the change is the window's start: its read holds nothing after it; a
        # step of the others' watts already taken since leaves it to the usual detection)
        window = [e for e in self._counter_seen if e[0] >= since - 1e-9]
        if len(window) < CHANGE_TICKS + 1:
            return None
        if not self._counter_usable(window):
            return None
        others = max(0.0, self.offset_w)
        measured = self._counter_against_table(window)
        if measured is None or measured[1] < MIN_ABOVE_W:
            return None
        board, predicted = measured
        known = self.confirmed_duty()
        cautious = self._cautious_share(max(e[5] for e in window), known) if known is not None else self.table_share
        excess = board - others - max(SHARE_RANGE[1], cautious) * predicted
        if excess <= max(TENANT_STEP_W, CHANGE_MARGIN * predicted):
            return None
        last = self._counter_against_table(window[-2:])
        return excess if last is None else max(excess, last[0] - others - self.table_share * last[1])

    def _follow_share(self, measured: float, predicted_w: float, ours: float) -> bool:
        """Move the share towards what the counter measured. Past SHARE_RANGE's top, the
        board draws more than any drift of ours explains: the rest is another tenant's
        (one that arrived with a budget step, or while the board was at its cap, where its
        readings could not show a step), taken into the others' watts. Whether the share
        was learned (not a tenant's step)."""
        excess = (measured - SHARE_RANGE[1]) * predicted_w
        if excess > TENANT_STEP_W:
            self._set_share(SHARE_RANGE[1])
            self._take_step(excess, ours)
            return False
        self._set_share(self.table_share + COUNTER_GAIN * (measured - self.table_share))
        return True

    def _move_share(self) -> None:
        """The board moves to another operating point (a budget step, a switch): the share
        learned where it ran transfers in part (SHARE_KEPT)."""
        self.table_share = 1.0 + SHARE_KEPT * (self.table_share - 1.0)

    def _set_share(self, share: float) -> None:
        self.table_share = min(SHARE_RANGE[1], max(SHARE_RANGE[0], share))

    def _record_counter(self, table) -> None:
        """Remember this tick for the counter's share: the counter's joules now, and the watts
        above idle the table of what ran since the tick before predicts at the duty that ran
        (None where nothing known ran alone)."""
        read = self._energy[-1] if self._energy and self._energy[-1][0] == self.clock() else None
        expected = table.extrapolated_power(self.loop.duty, self.idle_w) if table is not None else None
        above = expected - self.idle_w if expected is not None else None
        entry = (self.clock(), read[1] if read else None, above, self.offset_w, table, self.loop.duty)
        self._counter_seen = [*self._counter_seen[-COUNTER_WINDOW:], entry]

    def _counter_power(self, table) -> float | None:
        """The board's watts by the energy counter over the last LEARN_WINDOW ticks, where all
        of them ran `table`'s configuration at one duty (within STILL_DUTY), the others' watts
        held and the counter did not stall: what a table learns, far steadier than one reading
        (on the H100 0.3 s of the counter scatter by about 3% of the watts above idle where a
        reading scatters by 10%). None otherwise."""
        window = self._counter_seen[-(LEARN_WINDOW + 1):]
        if len(window) <= LEARN_WINDOW or any(e[1] is None or e[4] is not table for e in window):
            return None
        if any(e[3] != window[0][3] or abs(e[5] - window[-1][5]) > STILL_DUTY for e in window):
            return None
        if self._stall_j or any(window[0][0] <= t for t, _ in self._stalls):
            return None
        seconds = window[-1][0] - window[0][0]
        return (window[-1][1] - window[0][1]) / seconds if seconds > 0 else None

    def _counter_window(self) -> tuple[float, float] | None:
        """(watts above idle the energy counter measured, watts above idle the tables predicted
        for the duties that ran) over the last COUNTER_WINDOW ticks (the counter shows the
        energy of about COUNTER_LAG of a tick before: each tick's prediction is blended with
        the one before); None unless every tick of the window is known and the counter did
        not stall."""
        window = self._counter_seen
        if len(window) <= COUNTER_WINDOW or not self._counter_usable(window):
            return None
        measured = self._counter_against_table(window[1:])
        return None if measured is None or measured[1] < MIN_ABOVE_W else measured

    def _counter_usable(self, window: list[tuple]) -> bool:
        """Whether the counter's ticks in `window` can be read against the tables: every one
        read and predicted, the others' watts held after its first (where they moved, it holds
        watts of before the step: a tenant that just left, read again as one arriving), and no
        stall of the counter since its start."""
        if any(e[1] is None or e[2] is None for e in window):
            return False
        if any(e[3] != window[-1][3] for e in window[1:]):
            return False
        return not (self._stall_j or any(window[0][0] <= t for t, _ in self._stalls))

    def _counter_against_table(self, entries: list[tuple]) -> tuple[float, float] | None:
        """(watts above idle the energy counter measured from the first of `entries` to the
        last, the tables' watts above idle for the duties that ran then): the counter shows the
        energy of about COUNTER_LAG of a tick before, so each tick's prediction is blended with
        the one before. None over no time."""
        seconds = entries[-1][0] - entries[0][0]
        if seconds <= 0:
            return None
        predicted = sum((1 - COUNTER_LAG) * e[2] + COUNTER_LAG * before[2]
                        for before, e in zip(entries, entries[1:])) / (len(entries) - 1)
        return (entries[-1][1] - entries[0][1]) / seconds - self.idle_w, predicted

    def _step(self, innovation: float, sigma: float, scale: float) -> float | None:
        """The size of a step in the innovation, if this reading shows one (module docstring)."""
        if abs(innovation) > scale * max(TENANT_STEP_W, TENANT_SIGMAS * sigma):
            self._reset_cusum()
            return innovation
        z = innovation / (scale * sigma)
        # A reading that averages a window of `lag` ticks shares most of its error with the
        # readings before it: each adds 1/lag of a reading's evidence (a shift must last as
        # long in windows as CUSUM_ALARM readings' worth of independent evidence).
        weight = 1.0 / max(1, self._reading_lag)
        for side, signed in ((0, z), (1, -z)):
            self._cusum[side] = max(0.0, self._cusum[side] + weight * (signed - CUSUM_SLACK))
            if self._cusum[side] > 0.0:
                self._cusum_sum[side] += innovation
                self._cusum_n[side] += 1
            else:
                self._cusum_sum[side], self._cusum_n[side] = 0.0, 0
            if self._cusum[side] > CUSUM_ALARM:
                size = self._cusum_sum[side] / self._cusum_n[side]
                self._reset_cusum()
                return size if abs(size) >= TENANT_STEP_W else None
        return None

    def _reset_cusum(self) -> None:
        self._cusum, self._cusum_sum, self._cusum_n = [0.0, 0.0], [0.0, 0.0], [0, 0]

    def _take_step(self, step: float, ours: float, arrived_s: float = ARRIVED_BEFORE_S) -> None:
        """Watts we did not make came or went: the others' watts take them (never below none;
        what falls below is our board drawing less, the share's)."""
        taken = step if step > 0 else max(step, -max(0.0, self.offset_w))
        self.offset_w += taken
        rest = step - taken
        if rest and taken < 0:
            # (what falls below the others' watts that left was counted in the share while they
            # were on: theirs too. Where none were on, a sudden fall is our work pausing inside
            # a step (a host's hiccup, a rank waiting on a peer), which a share does not do in a
            # tick: its readings pass, and a drift of the board reaches the share through the
            # counter. Taken into the share, a 0.3 s hiccup of one of two H200s took it from
            # 1.01 to its floor in one reading, the duty to full, and the return 160 W over.)
            share = self.table_share * (1.0 + rest / max(MIN_ABOVE_W, ours - self.idle_w))
            self.table_share = min(SHARE_RANGE[1], max(SHARE_RANGE[0], share))
        self._offset_moved_t = self.clock()
        self._tenant_step = True
        if taken > 0:
            # they drew since before this reading: every 1 s window holding their arrival
            # holds that much more than we could answer, repaid over the next second
            self._held_back.append((self.clock(), taken * max(ARRIVED_BEFORE_S, arrived_s)))
        self._events.append(f"others' watts now {self.offset_w:.0f} W")
