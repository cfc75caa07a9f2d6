"""Ticks in which our own work stopped: a training loop waiting on its data, an evaluation or
a checkpoint outside the controlled steps, a host that stalls.

The board then falls toward idle at an unchanged duty. Read as the table's error, such a fall
took the share to its floor, widened the margin (one 1 s window far under the aim is a large
scatter), and when the work came back the board's watts over the shrunken table were taken for
another tenant's. On four H200s a 1.3 s stall in the middle of a 2400 W run left 250-300 W of
"others' watts" and the margin at 8 % for the rest of the run: 0.90 of the static front, where
the runs beside it made 0.96.

A tick's work is the GPU time its tokens take at each (shape, configuration)'s full-duty rate;
the work expected is what the duties that ran give over the same ticks. Over the last
STALL_SPAN_S (one and a half of the longest step at its duty, where that is longer: a step's
tokens are credited over its expected length, and pacing between steps leaves ticks with none),
work under STALL_SHARE of what the duties expect is a stall, if the reading fell with it (under
what the table predicts at the duty, by BELOW_SIGMAS of the readings' noise): work slowed by
another tenant taking the GPU's time comes with their watts, and those are answered as ever.

The work shows a stall up to a step later than the readings do, so at its detection what the
readings taught since a tick before the span began is undone, from a snapshot taken each tick:
the share, the others' watts and their step detection, the margin and its windows, the
filtered power, the duty. The stall lasts until the work is back (RESUMED_SHARE of what the
duties expect) for RECOVER_S. Meanwhile and after it, no reading that averages a window holding
any of the stall is learned or acted on (its idle, read at the duty realized in the window, is
no reading of our watts there: the duty holds), no 1 s window holding any of it teaches the
margin, and the energy counter's windows for the share start afresh. A tick with no work teaches
nothing anyway.

Only steps are watched (`Controller.step`, which sets `watch_stalls`): attention calls are often
a part of a larger step whose other work the controller does not see, and a tick without
attention there is no stall.

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's model, loop,
noise, clock and tables.
"""
from __future__ import annotations

import collections
import copy

from flashwatt.control.power_holding import OVERSHOOT_CUT

STALL_SPAN_S = 0.3  # three ticks: a step's credit is spread over its expected length
STALL_SHARE = 0.3  # of the work the duty expects (2 ms pacing on the H200 keeps 0.75 or more)
RESUMED_SHARE = 0.6
RECOVER_S = 1.0
BELOW_SIGMAS = 2.0
MAX_SPAN_S = 4.0
FLOOR_SIGMAS = 1.0  # a hidden reading over the budget by this many of the noise's deviations, twice, cuts
STALL_EVENT = "our work stopped"  # how a stall begins in the trace's events (counted by metrics.summarize)
SNAPSHOTS_S = MAX_SPAN_S + 0.5  # what a stall's detection may undo
# What the readings teach tick by tick and a stall's undoes (tables learn only from readings
# that no step of the others' watts or the share took, which a stall's fall is).
LEARNED = ("table_share", "offset_w", "_offset_moved_t", "_cusum", "_cusum_sum", "_cusum_n", "_below_last",
           "_confirmed", "margin", "_window_w", "_held_back", "power_filtered")


class WorkStall:
    """The governor's watch on its own work (module docstring)."""

    def _init_work_stall(self) -> None:
        self.watch_stalls = False
        self._work_ticks: collections.deque = collections.deque()  # (t, seconds, GPU seconds done, duty)
        self._stall_since: float | None = None  # when the work of a stall began to fall
        self._resumed_t: float | None = None  # when the work came back, the readings not yet
        self._stall_spans: collections.deque = collections.deque(maxlen=8)  # (start, end) of past stalls
        self._snapshots: collections.deque = collections.deque()  # (t, what the readings taught before it)
        self._recent_keys: set = set()  # the (shape, configuration)s of the last tick with work
        self._first_done_t: float | None = None  # the first tick with work done
        self._last_floor: float | None = None  # the last reading a stall hid (_cut_on_a_floor)

    def _gpu_seconds(self, work) -> float | None:
        """The GPU time `work` took at full duty: each (shape, configuration)'s tokens at its
        own rate; None where one of them has no rate yet."""
        seconds = 0.0
        for key, (_, tokens) in work.by_key.items():
            stats = self.model.stats.get(key)
            rate = stats.tokens_per_s_full if stats is not None else None
            if not rate:
                return None
            seconds += tokens / rate
        return seconds

    def _span_s(self) -> float | None:
        """How far back the work is judged: STALL_SPAN_S, and one and a half of the longest
        step of what ran lately at its duty (a step's tokens are credited over its length, and
        pacing between steps leaves ticks with none); None past MAX_SPAN_S, where a stall
        cannot be told from pacing in time to matter."""
        lag = self._credit_lag_s()
        if lag is None:
            return None
        span = max(STALL_SPAN_S, 1.5 * lag)
        return span if span <= MAX_SPAN_S else None

    def _work_share(self, now: float) -> float | None:
        """The work done over the span (_span_s) over what the duties that ran expect there;
        None where it cannot be told (a rate not yet known, the span reaching back before the
        first work)."""
        span = self._span_s()
        if span is None or self._first_done_t is None or now - span < self._first_done_t:
            return None
        ticks = [e for e in self._work_ticks if e[0] > now - span + 1e-9]
        expected = sum(seconds * duty for _, seconds, _, duty in ticks)
        if not ticks or any(done is None for _, _, done, _ in ticks) or expected <= 0:
            return None
        return sum(done for _, _, done, _ in ticks) / expected

    def _note_work(self, now: float, work, dt: float, power: float | None) -> None:
        """This tick's work, and whether a stall begins (the work fell, and the reading with
        it) or its work is back (module docstring)."""
        if not self.watch_stalls:
            return
        # (the duty the tick ran at: set at the tick before)
        done = self._gpu_seconds(work)
        self._work_ticks.append((now, dt, done, self.loop.duty))
        if work.by_key:
            self._recent_keys = set(work.by_key)
            if done and self._first_done_t is None:
                self._first_done_t = now
        while self._work_ticks and self._work_ticks[0][0] < now - MAX_SPAN_S:
            self._work_ticks.popleft()
        share = self._work_share(now)
        if self._stall_since is None and share is not None and share < STALL_SHARE and self._below_table(power):
            self._begin_stall(now)
        elif self._stall_since is not None and share is not None:
            if share < RESUMED_SHARE:
                self._resumed_t = None
            elif self._resumed_t is None:
                self._resumed_t = now
            elif now - self._resumed_t >= RECOVER_S:
                self._end_stall(now)
        if self._stall_since is None:
            self._snapshots.append((now, self._learned_now()))
            while self._snapshots and self._snapshots[0][0] < now - SNAPSHOTS_S:
                self._snapshots.popleft()

    def _learned_now(self) -> dict:
        state = {name: copy.copy(getattr(self, name)) for name in LEARNED}
        state["loop"] = (self.loop.duty, self.loop.integral)
        return state

    def _begin_stall(self, now: float) -> None:
        """The work fell: undo what the readings taught since a tick before the fall could
        show in them (module docstring), and hide the readings from now on."""
        start = now - (self._span_s() or STALL_SPAN_S)
        before = [state for t, state in self._snapshots if t <= start - 0.1 + 1e-9]
        if before:
            for name, value in before[-1].items():
                if name == "loop":
                    self.loop.duty, self.loop.integral = value
                else:
                    setattr(self, name, value)
        self._stall_since, self._resumed_t = start, None
        self._counter_seen = []  # no counter window spans the stall
        self._snapshots.clear()
        self._events.append(f"{STALL_EVENT} {now - start:.1f} s ago: what its readings taught is undone")

    def _credit_lag_s(self) -> float | None:
        """How long after the work stopped its ticks may still be credited tokens: the longest
        step (at the duty it runs) of what ran in the last ticks; None while one of them has no
        step's length yet."""
        lag = 0.0
        for key in self._recent_keys:
            stats = self.model.stats.get(key)
            if stats is None or not stats.s_per_call:
                return None
            lag = max(lag, stats.s_per_call / max(0.05, self.loop.duty))
        return lag

    def _end_stall(self, now: float) -> None:
        self._stall_spans.append((self._stall_since, now))
        self._events.append(f"our work back after {now - self._stall_since:.1f} s")
        self._stall_since = self._resumed_t = None
        self._counter_seen = []

    def _below_table(self, power: float | None) -> bool:
        """Whether `power` is under what our table predicts at the duty that ran, with the
        others' watts, by more than BELOW_SIGMAS of the readings' noise (False where it cannot
        be told)."""
        if power is None or self.idle_w is None:
            return False
        # (at the duty the pacer realized: the host's waits are part of a stall, not its idle)
        duty = self._window_paced if self._window is not None else self._ran_duty()
        ours = self.table_power(self._running_table(), duty)
        if ours is None:
            return False
        predicted = ours + max(0.0, self.offset_w)
        return power < predicted - BELOW_SIGMAS * self.noise.sigma_w(predicted)

    def _stall_hides(self, now: float) -> bool:
        """Whether this tick's reading averages a window that holds any of a stall: its idle,
        read at the duty realized in the window, is no reading of our watts at that duty. (An
        instant reading in a stall comes with a tick of no work, which teaches nothing anyway.)"""
        return self._window is not None and self._stall_in(now - self._window[1], now)

    def _cut_on_a_floor(self, power: float, ran: float) -> None:
        """A reading hidden by a stall (`_stall_hides`) is still a floor of our watts at the
        duty that ran: the stall's idle in its window pulls it down. Over the budget beyond the
        noise, the work is back drawing more than the duty may (boards cooled by the idle draw
        more: four H200s 2.55-2.67 kW at full duty after a stall, 2.35-2.45 kW before it, held
        over a 2.4 kW budget for 1.2 s), and the power prior's curve cuts, more than any
        measured curve needs; nothing is learned. A floor needs fewer deviations than a
        reading (FLOOR_SIGMAS, in two of them in a row): it can only be under our watts."""
        last, self._last_floor = self._last_floor, power
        if self.idle_w is None or self.setpoint_w is None or power <= self.idle_w or last is None:
            return
        sigma = self.noise.sigma_w(self.power_filtered if self.power_filtered is not None else power)
        if min(power, last) <= self.budget_w * (1 + OVERSHOOT_CUT) + FLOOR_SIGMAS * sigma:
            return
        duty = self._prior_cut(power, ran)
        if duty < self.loop.duty:
            self.loop.reset(duty)
            self._events.append(f"cut on a stall's readings: {power:.0f} W over the budget, duty {self.loop.duty:.2f}")

    def _stall_in(self, start: float, end: float) -> bool:
        """Whether a stall, past or going on, overlaps the window from `start` to `end`."""
        if self._stall_since is not None and self._stall_since < end:
            return True
        return any(s < end and e > start for s, e in self._stall_spans)
