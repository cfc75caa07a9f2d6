"""Readings that average a window of a step's pacing cycles: what the governor learns from
them, and the duty it sets from one before a table knows the configuration.

While a step's pacing cycle is longer than a tick (a step paced between steps only), the
controller hands the governor the energy counter's average over the last cycles with the
duty realized in that window (flashwatt.control.counter_power; `Reading.duty`,
`Reading.window_s`). Such a reading is one exact point of the duty -> power curve, but of
the window, not of the last tick: a tick's work is bursty (a step's tokens are credited
while it runs, none while the pacer sleeps) and the duty the loop set a tick ago has not
shown in it yet. So, for it:

- the duty the reading was drawn at is the realized one (tables, the innovation the others'
  watts and the share follow, a cut), never the duty set now;
- a table learns the point with the tokens per second of the whole window, where one
  configuration ran in every tick of the window that ran any (a switch inside the window
  mixes two tables); a reading at one tick's duty cannot be had (the duty of the window is
  what it is) and needs none;
- before a table exists, the duty is the one the line from idle through the window's point
  gives for what the loop aims at (a step's average power over whole cycles is idle plus the
  busy share of its watts above idle: a line), at most the loop's climb above the duty now;
  a window that shows no watts above idle (all of it slept, or a step that barely loads the
  board) gives the higher of the power prior's duty, which no measured curve draws more
  than (flashwatt.control.power_bound), and the loop's climb from the duty now. An incremental
  loop acting on a reading a second late climbs for that second and swings (on the
  simulated board from duty 0.01 to 0.89 every 2.6 s).

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's loop,
model, offset, idle power and aim.
"""
from __future__ import annotations

import collections

from flashwatt.control.counter_power import MAX_WINDOW_S
from flashwatt.control.power_bound import prior_duty
# Watts above idle a window must show for its line from idle: the tables' own floor.
from flashwatt.control.table_error import MIN_ABOVE_W


class WindowReadings:
    """The governor's use of readings that average a window (module docstring)."""

    def _init_window_readings(self) -> None:
        self._window: tuple[float, float] | None = None  # (realized duty, seconds) of this tick's reading
        self._window_paced: float | None = None
        self._tick_work: collections.deque = collections.deque()  # (t, (shape, config) keys, tokens) per tick
        self._reading_lag = 1  # readings this tick's reading's window spans (1: an instant reading)

    def _take_window(self, reading, work) -> None:
        """This tick's reading and work: whether the reading averages a window, and the work
        kept for the windows to come."""
        averaged = reading.duty is not None and reading.window_s and reading.power_w is not None
        self._window = (reading.duty, reading.window_s) if averaged else None
        # (the duty the pacer realized in it, the host's own waits counted busy: what a stall of
        # our work is told against, flashwatt.control.work_stall)
        self._window_paced = (reading.paced_duty if reading.paced_duty is not None else reading.duty) \
            if averaged else None
        self._tick_work.append((reading.t, frozenset(work.by_key), work.tokens))
        while self._tick_work and self._tick_work[0][0] < reading.t - MAX_WINDOW_S - 1.0:
            self._tick_work.popleft()

    def _window_lag(self, tick_s: float) -> int:
        """How many ticks this tick's reading's window spans: readings that far apart share
        no part of their windows (their errors are independent), closer ones share most."""
        if self._window is None:
            return 1
        return max(1, round(self._window[1] / max(1e-3, tick_s)))

    def _ran_duty(self) -> float:
        """The duty this tick's reading was drawn at: the window's realized one, or the
        loop's since the last tick."""
        return self._window[0] if self._window is not None else self.loop.duty

    def _window_work(self, now: float) -> tuple[tuple | None, float, int]:
        """((shape, configuration) that ran alone in the window, or None; tokens per second
        over the window; how many (shape, configuration) ran in it)."""
        _, seconds = self._window
        ticks = [entry for entry in self._tick_work if entry[0] > now - seconds + 1e-9]
        keys = frozenset().union(*(keys for _, keys, _ in ticks))
        tokens = sum(tokens for _, _, tokens in ticks)
        return (next(iter(keys)) if len(keys) == 1 else None), tokens / seconds, len(keys)

    def _learn_window(self, power: float) -> None:
        """Fold a window's reading into the model (module docstring)."""
        self._counter_seen = []  # the per-tick counter's share reads the duty of one tick: not here
        now = self.clock()
        key, tokens_per_s, ran = self._window_work(now)
        if key is None:
            # A window of a mix of shapes, or of none (all of it slept at the lowest duty),
            # teaches no configuration's table, but the others' watts still follow it: read
            # against the mix's table, or against none (then only a tenant that left is taken).
            # Returning before this kept a tenant's watts after it left for as long as the
            # windows held a mix: seconds at the lowest duty on an idle board.
            mix = self.model.mix_power if ran > 1 and self.model.mix_power.bins else None
            self._observe(power, mix, True)
            return
        table = self.model.power.get(key)
        if not self._observe(power, table, True) or self._others_present():
            return
        ours = power - self.offset_w
        duty = self._ran_duty()
        near_setpoint = self.setpoint_w is not None and abs(power - self.setpoint_w) <= 0.1 * self.setpoint_w
        self.model.add_tick(*key, tokens_per_s, ours, self.idle_w, duty, comparable=near_setpoint or duty >= 0.98)

    def _window_duty(self, power: float | None) -> float | None:
        """Without a table: the duty from the window's line from idle, or the prior's (module
        docstring); None for a reading of one tick (the loop's own climb then)."""
        if self._window is None or power is None or self.idle_w is None:
            return None
        watts = self._aim_w() - max(0.0, self.offset_w)
        above = power - max(0.0, self.offset_w) - self.idle_w
        duty = self._window[0]
        if above < MIN_ABOVE_W or duty <= 0.0:
            # No line to draw. The prior's duty is safe whatever the board; a window that ran
            # and still shows nothing above idle says more may run: climb from there as the
            # loop does (a step that barely loads the GPU, a board that does not move, would
            # otherwise stay at the prior's duty for good, 0.02 at 400 W on two 700 W boards)
            prior = prior_duty(watts, self.idle_w, self.limit_w, self.loop.d_min, self.loop.d_max)
            return max(prior, min(self.loop.duty + self.loop.max_rise, self.loop.d_max))
        line = duty * max(0.0, watts - self.idle_w) / above
        return max(self.loop.d_min, min(line, self.loop.duty + self.loop.max_rise, self.loop.d_max))
