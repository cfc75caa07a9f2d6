"""The decisions of the power-aware controller, free of torch and of NVML: the loop and the
budget here; choosing a configuration per call shape in flashwatt.control.shape_choices;
moving the duty to hold the budget between ticks in flashwatt.control.power_holding; what
the tables do not explain (the board's drift, other tenants' watts) in
flashwatt.control.table_error; how noisy one reading is in flashwatt.control.reading_noise.

The `Governor` is fed two things: each sensor tick's reading (about 10 Hz) with the work
done since the last tick, and GPU-time samples of single calls. From them it keeps the
online model (flashwatt.control.model) and answers, per call, which configuration runs
that call's shape, and per tick, which duty the pacing holds. Being pure logic with an
injected clock, the same object runs the GPU and the simulated plant of the tests.

Modes
    budget  maximise throughput with average power at or under the budget: the set point is
            the budget less a margin; the configuration with the most predicted throughput at
            that power is chosen, and the duty loop trims power by feedback.
    energy  minimise joules per token (optionally within a slowdown bound), at full duty:
            pacing leaves idle power burning between calls, so it never lowers J/token on
            the boards measured (docs/control.md).
    static  one fixed configuration and duty: the baseline and the oracle's rows; needs no
            telemetry.

Each shape goes through probe, explore, exploit and, now and then, recheck
(flashwatt.control.shape_state). Exploration is bounded: a configuration is tried only at a
duty whose predicted power (flashwatt.control.power_bound), with the watts of other tenants,
is within the set point; one that would exceed it even at the lowest duty is deferred.

Stability: a choice is kept for at least `dwell_s` and changes only for a predicted gain
above `hysteresis`, so two configurations of near-equal merit never alternate. A budget
step (a change of STEP_MIN_W or more) re-decides at once and moves the duty at once, from
the configuration's duty -> power table; smaller changes (a ramp) are tracked by the loop.

Others' watts: what the running configuration's table does not explain is the board's
drift (a share of the table's watts) or another tenant's; a step in it is taken whole as a
tenant's (the duty follows at once), and while one is on the board nothing is learned
(docs/control.md, "What the tables miss"). The tables learn from the energy counter over the last
ticks at one duty (steadier than one reading), a few ticks late and only if no tenant's step
came meanwhile.

Telemetry failure: when no valid reading arrives for `stale_s`, the governor falls back to
the most frugal operating point it knows (the configuration and duty with the lowest power
seen, else the lowest duty, never above what the power prior puts within the set point),
says why in the trace, and resumes once readings return. Ticks without a reading leave the
duty where it is (the loop does not integrate an old error).
"""
from __future__ import annotations

import collections
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from flashwatt.control.budget_schedule import STEP_MIN_W
from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.control.duty_loop import DutyLoop
from flashwatt.control.model import DUTY_BINS, OnlineModel
from flashwatt.control.power_bound import prior_duty
from flashwatt.control.power_holding import PowerHolding
from flashwatt.control.reading_noise import MIX_PRIOR_SHARE, ReadingNoise
from flashwatt.control.shape_choices import PROBE_SAMPLES, ShapeChoices
from flashwatt.control.shape_state import EXPLOIT, EXPLORE, PROBE, RECHECK, ShapeState
from flashwatt.control.table_error import COUNTER_LAG, MIN_ABOVE_W, TableError
from flashwatt.control.thermal_holding import FLOOR_ABOVE_IDLE_W, ThermalLimit
from flashwatt.control.window_readings import WindowReadings
from flashwatt.control.work_stall import WorkStall

MODES = ("budget", "energy", "static")
# Others' watts over this share of the set point (of the power in energy mode): the model
# learns nothing (Governor._others_present).
OTHERS_PRESENT = 0.05
# After a budget step, the runner-up is re-checked this soon (once the loop has settled).
RECHECK_AFTER_STEP_S = 1.5
# The set point's margin keeps this many standard deviations of the 1 s averages of power
# under the budget plus the tolerance the budget is judged with (flashwatt.control.metrics).
MARGIN_SIGMAS = 2.5
WINDOW_TOLERANCE = 0.03
# Until this many 1 s averages (one per tick) at one budget have shown their scatter, the
# margin is at least the base margin; after, only what the scatter asks for (Governor._adapt_margin).
MARGIN_EARNED_AFTER = 30
# The sensor's period, seconds (flashwatt.control.sensor): one tick.
SENSOR_PERIOD_S = 0.1
# Weight of a new reading in the filtered power (what settling and a budget step read), and
# the filtered power's scatter for a reading's: sqrt(w / (2 - w)).
FILTER_NEW = 0.5
# A run's first readings may show the idle board while its calls already run (on the H200 the
# reading 0.1 s into a run read 145 W, idle 132 W, and the next 664 W): until one shows our
# watts (MIN_ABOVE_W over idle), for at most this long from the first reading with our calls on
# the board, a reading at idle is not one of what we hold. Taken as one, it made the loop,
# which had no table for what ran yet, climb from duty 0.74 to 0.99: readings of 664-738 W
# under a 580 W budget until a cut.
WAKE_S = 0.3
FILTERED_SPREAD = (FILTER_NEW / (2 - FILTER_NEW)) ** 0.5


@dataclass
class Reading:
    """One sensor tick of the controlled GPU; power None when NVML gave nothing."""

    t: float
    power_w: float | None
    energy_mj: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    clock_reasons: int | None = None
    error: str | None = None
    # NVML's utilization: the share of its last sample period (1/6 to 1 s) in which a kernel
    # ran, in percent. Not acted on: the driver's own count of the busy time the pacer counts.
    gpu_util_pct: float | None = None
    # Set where power_w is the energy counter's average over a window of a step's pacing
    # cycles (flashwatt.control.counter_power): the duty realized in it and its seconds.
    duty: float | None = None
    window_s: float | None = None
    # ... and the share of the window the pacer did not sleep: the duty it set, realized. Less
    # the host's own waits between steps it is `duty`, the share the GPU was given work.
    paced_duty: float | None = None
    # Set where pacing cycles are longer than a tick but the counter holds no window of them
    # yet: power_w is the instant reading of one phase of a cycle, telemetry that works but
    # no reading of our watts (flashwatt.control.counter_power).
    mid_cycle: bool = False


@dataclass
class Work:
    """What ran since the last tick: calls and tokens per (shape, configuration)."""

    by_key: dict = field(default_factory=dict)  # (shape, config) -> [calls, tokens]

    def add(self, shape: tuple, config: Configuration, tokens: int) -> None:
        entry = self.by_key.setdefault((shape, config), [0, 0])
        entry[0] += 1
        entry[1] += tokens

    @property
    def tokens(self) -> int:
        return sum(t for _, t in self.by_key.values())


class Governor(ShapeChoices, PowerHolding, TableError, WindowReadings, WorkStall):
    def __init__(self, mode: str, candidates: list[Configuration] | Callable[[tuple], list[Configuration]], *,
                 budget_w: float | None = None, idle_w: float | None = None, limit_w: float | None = None,
                 max_slowdown: float | None = None, static_duty: float = 1.0, margin: float = 0.02,
                 max_margin: float = 0.08, dwell_s: float = 3.0, explore_dwell_s: float = 0.6,
                 prune_below: float = 0.4, hysteresis: float = 0.05, stale_s: float = 0.5,
                 duty_range: tuple[float, float] = (0.01, 1.0), recheck_after_s: float = 4.0,
                 recheck_max_s: float = 32.0, recheck_within: float = 0.85, warm_start=None,
                 temp_limit_c: float | None = None, clock: Callable[[], float] = time.monotonic):
        if mode not in MODES:
            raise ControlError(f"mode {mode!r}: allowed {', '.join(MODES)}")
        if not callable(candidates):
            if not candidates:
                raise ControlError("no configuration to choose from")
            fixed = list(candidates)
            candidates = lambda shape: fixed  # noqa: E731 - the same list for every shape
        if mode == "budget" and budget_w is None:
            raise ControlError("mode 'budget' needs budget_w (watts)")
        if max_slowdown is not None and not 0 <= max_slowdown < 1:
            raise ControlError(f"max_slowdown={max_slowdown!r}: give a fraction in [0, 1)")
        if temp_limit_c is not None and mode != "budget":
            raise ControlError(f"temp_limit_c={temp_limit_c!r}: a temperature limit is held alongside a power "
                               f"budget (mode 'budget'), not in mode {mode!r}")
        self.mode = mode
        self.candidates_for = candidates
        self.idle_w = idle_w
        self.limit_w = limit_w
        self.max_slowdown = max_slowdown
        self.base_margin = margin
        self.max_margin = max_margin
        self.margin = margin  # base_margin, widened while 1 s averages of power spread (see _adapt_margin)
        self._energy: collections.deque = collections.deque(maxlen=40)  # (t, joules, aim)
        self._debt_j = 0.0  # energy the last second drew over its budget (see _aim_w)
        self._counter_last: tuple | None = None  # (t, joules) of the last read of the energy counter
        self._stall_j = 0.0  # joules a stalled read of the counter held back, until it catches up
        self._stalls: collections.deque = collections.deque(maxlen=20)  # (t, joules) of stalled reads
        # (t, joules) the counter will put in the windows starting then (a stall, a step down)
        self._held_back: collections.deque = collections.deque(maxlen=20)
        self._recent_w: collections.deque = collections.deque()  # (t, filtered power) of the last second
        self._window_w: collections.deque = collections.deque(maxlen=30)  # 1 s averages less the aim, one per tick
        self._quiet_since: float | None = None  # windows from here on hold no step of ours
        self._budget_moved_t = -math.inf  # the last change of the budget, a ramp's small ones included
        self._first_work_t: float | None = None  # the first reading with our calls on the board
        self._awake = False  # a reading has shown our watts, or WAKE_S passed since that one
        self.dwell_s = dwell_s
        self.explore_dwell_s = explore_dwell_s
        self.prune_below = prune_below
        self.hysteresis = hysteresis
        self.stale_s = stale_s
        self.recheck_after_s = recheck_after_s
        self.recheck_max_s = recheck_max_s
        self.recheck_within = recheck_within
        self.warm_start = warm_start  # a flashwatt.control.warm_start.WarmStartCache, or None
        self.clock = clock
        self.model = OnlineModel()
        self.shapes: dict[tuple, ShapeState] = {}
        gain = (limit_w - idle_w) if (limit_w and idle_w is not None and limit_w > idle_w) else 500.0
        self.loop = DutyLoop(plant_gain_w=gain, d_min=duty_range[0], d_max=duty_range[1])
        self.loop.duty = static_duty if mode == "static" else duty_range[1]
        self.budget_w = None
        self._budget_log: collections.deque = collections.deque(maxlen=64)  # (t, budget) of each change
        self.offset_w = 0.0  # watts on the board that no configuration of ours explains
        self._events: list[str] = []
        self._last_single: tuple | None = None  # the (shape, config) of the last tick, if only one ran
        self._several_shapes = False  # the last tick with work ran several shapes
        self._fresh_table_t = -float("inf")  # when another table last took over (power_holding._aim_w)
        self._tenant_step = False  # this tick saw a step in the watts of others
        self._offset_moved_t = -float("inf")  # when the estimate of the others' watts last moved
        self.thermal: ThermalLimit | None = None  # the temperature loop (flashwatt.control.thermal_holding)
        if budget_w is not None:
            self.set_budget(budget_w)
            if temp_limit_c is not None:
                self.thermal = ThermalLimit(temp_limit_c, (idle_w or 0.0) + FLOOR_ABOVE_IDLE_W, self.budget_w)
            if mode == "budget":
                self.loop.duty = self._start_duty()  # start low, let the loop climb
        self.power_filtered: float | None = None
        # How far one reading strays from the board's power: one shape's calls, and a mix of
        # shapes (whose readings scatter more); `noise` is the one for what runs now.
        self._noise_by_mix = {False: ReadingNoise(idle_w), True: ReadingNoise(idle_w, MIX_PRIOR_SHARE)}
        self._init_table_error()
        self._init_window_readings()
        self._init_work_stall()
        self._last_reading: float | None = None  # the reading before (two in a row over the budget cut)
        self._settled_since: float | None = None
        self.last_valid_t: float | None = None
        self.fallback_reason: str | None = None
        self._last_tick_t: float | None = None
        self._last_duty = self.loop.duty
        self._prev_duty = self.loop.duty

    # ---- settings ----------------------------------------------------------------------
    def set_budget(self, budget_w: float) -> None:
        """A new budget. A step (STEP_MIN_W or more) re-decides every shape and moves the
        duty now; a smaller change (a ramp) is left to the loop."""
        budget_w = float(budget_w)
        if self.idle_w is not None and budget_w <= self.idle_w:
            raise ControlError(f"budget {budget_w:.0f} W is at or under this GPU's idle power "
                               f"({self.idle_w:.0f} W): no workload fits")
        if self.limit_w is not None and budget_w > self.limit_w:
            raise ControlError(f"budget {budget_w:.0f} W is over this GPU's enforced power limit "
                               f"({self.limit_w:.0f} W); the card cannot draw more than the limit")
        before, self.budget_w = self.budget_w, budget_w
        # (the first budget holds from the start, whatever the clock reads before the run's)
        self._budget_log.append((-math.inf if before is None else self.clock(), budget_w))
        if self.thermal is not None:
            self.thermal.set_ceiling(budget_w)
        if before is not None and budget_w != before:
            self._budget_moved_t = self.clock()
        if before is None or abs(budget_w - before) < STEP_MIN_W:
            return
        now = self.clock()
        self._events.append(f"budget {budget_w:.0f} W")
        if budget_w < before and self._recent_w and self.mode == "budget":
            # The counter reads COUNTER_LAG of a tick behind the board: a 1 s window that began
            # in the last second, at up to the highest power of that second, and ends at the
            # new budget, holds that much more than the board drew in it.
            fall = max(0.0, max(w for _, w in self._recent_w) - self.setpoint_w)
            self._held_back.append((now, fall * COUNTER_LAG * SENSOR_PERIOD_S))
        if self.fallback_reason is not None:
            return  # blind: the frugal fallback holds until readings return, whatever the budget
        self.loop.hold()
        self._window_w.clear()  # spread around the old budget says nothing of the new one
        self.margin = max(self.margin, self.base_margin)  # to be earned again at this budget
        self._quiet_since = now
        self._move_share()
        switched = False
        for shape, state in list(self.shapes.items()):
            if state.phase == RECHECK:  # a re-check across a step compares nothing: back to the choice
                state.phase = EXPLOIT
                state.run(state.choice, now, self._samples(shape, state.choice))
            if state.phase == EXPLOIT:
                switched |= self._choose(shape, state, now, skip_dwell=True)
                state.next_recheck_t = min(state.next_recheck_t, now + RECHECK_AFTER_STEP_S)
                state.recheck_every_s = self.recheck_after_s
        if not switched:
            self._retarget()

    @property
    def noise(self) -> ReadingNoise:
        return self._noise_by_mix[self._several_shapes]

    @property
    def held_w(self) -> float | None:
        """The power the loop holds: the budget, or under it the temperature loop's cap."""
        if self.budget_w is None:
            return None
        return min(self.budget_w, self.thermal.cap_w) if self.thermal is not None else self.budget_w

    @property
    def setpoint_w(self) -> float | None:
        held = self.held_w
        return None if held is None else held * (1 - self.margin)

    @property
    def duty(self) -> float:
        return self.loop.duty

    # ---- per call ----------------------------------------------------------------------
    def config_for(self, shape: tuple) -> Configuration:
        state = self.shapes.get(shape)
        if state is None:
            state = self._new_shape(shape)
        elif state.phase != EXPLOIT:
            self._advance(shape, state)
        return state.config

    def on_latency(self, shape: tuple, config: Configuration, seconds: float, tokens: int) -> None:
        stats = self.model.stats.get((shape, config))
        if self._others_present() and stats is not None and stats.latency_samples >= PROBE_SAMPLES:
            return  # another process takes part of the GPU's time: this call's time is not ours alone
        self.model.add_latency(shape, config, seconds, tokens)

    def _others_present(self) -> bool:
        """Another tenant's watts are on the board: what is measured now (GPU time, tokens
        per watt, our table's watts) is shared with it, and would mislead every later run
        through the warm start, so nothing is learned."""
        reference = self.setpoint_w if self.setpoint_w is not None else (self.power_filtered or 0.0)
        return self.offset_w > OTHERS_PRESENT * reference

    def forbid(self, shape: tuple, config: Configuration, reason: str) -> None:
        """A configuration this shape must not use (e.g. its precision failed the check)."""
        state = self.shapes.get(shape) or self._new_shape(shape)
        state.forbidden[config] = reason
        self._events.append(f"refused {config.label}: {reason}")
        for pending in (state.to_probe, state.to_explore):
            if config in pending:
                pending.remove(config)
        if state.config != config and state.choice != config:
            return
        now = self.clock()
        if state.phase == PROBE:
            self._advance_probe(shape, state)
        elif state.phase == EXPLORE:
            self._advance_exploration(shape, state, force=True)
        else:
            state.phase = EXPLOIT
            if state.choice == config:
                self._choose(shape, state, now, force=True)
            state.run(state.choice, now, self._samples(shape, state.choice))

    # ---- per tick ----------------------------------------------------------------------
    def tick(self, reading: Reading, work: Work) -> dict:
        """Take one reading and the work since the last tick; set the duty; return a trace row."""
        now = reading.t
        self._take_window(reading, work)
        dt = 0.1 if self._last_tick_t is None else max(1e-3, now - self._last_tick_t)
        self._last_tick_t = now
        self._note_work(now, work, dt, reading.power_w)
        power = reading.power_w
        if self.thermal is not None:
            self.thermal.update(now, reading.temp_c)
        self._adapt_margin(now, self._counter_joules(now, reading.energy_mj, power))
        floor = None  # a reading a stall hides: a floor of our watts at the duty that ran
        if power is not None:
            self.last_valid_t = now
            if not reading.mid_cycle and not self._waking(now, power) and self._stall_hides(now):
                floor = power
            if reading.mid_cycle or self._waking(now, power) or floor is not None:
                power = None  # telemetry works; this reading says nothing of our watts at the duty
        if power is not None:
            still = (abs(self.loop.duty - self._last_duty) < 0.03 and abs(self._last_duty - self._prev_duty) < 0.03
                     and work.tokens > 0 and not self._just_changed())
            self._reading_lag = self._window_lag(dt)
            self.noise.add(power, self.power_filtered if self.power_filtered is not None else power, still,
                           lag=self._reading_lag, duty=self._ran_duty())
            # (a reading before our first call shows the board without us: not what we hold)
            if self.shapes:
                self.power_filtered = power if self.power_filtered is None else (
                    (1 - FILTER_NEW) * self.power_filtered + FILTER_NEW * power)
                self._recent_w.append((now, self.power_filtered))
            while self._recent_w and self._recent_w[0][0] < now - 1.0:
                self._recent_w.popleft()
        else:
            self.noise.forget_previous()
        tokens_per_s = work.tokens / dt
        self._learn(work, power, tokens_per_s)
        stale = self.last_valid_t is None or now - self.last_valid_t > self.stale_s
        phase = "static"
        if self.mode != "static":
            if stale and self.mode == "budget":
                if self.fallback_reason is None:
                    self.fallback_reason = reading.error or f"no power reading for {self.stale_s:g} s"
                    self._enter_fallback()
                phase = "fallback"
            else:
                if self.fallback_reason is not None:
                    self._resume(now)
                ran = self._ran_duty()  # the duty this reading was drawn at, before this tick moves it
                self._decide(now)
                phase = self._phase()
                if self.mode == "budget" and self.power_filtered is not None and power is not None:
                    table = self._running_table()  # what runs from now, not what ran before
                    # The feed-forward reads the table of our own watts, scaled by the share the
                    # board draws now, at the set point less the watts of others
                    # (flashwatt.control.table_error: both learned from the readings, averaged).
                    # A tick without a reading leaves the duty alone.
                    feed_forward = self._feed_forward(table)
                    if feed_forward is None:  # no table yet: a window's line from idle, if the reading is one
                        feed_forward = self._window_duty(power)
                    self.loop.update(self._aim_w(), self.power_filtered, dt, feed_forward)
                    self._cut_overshoot(power, table, ran)
                elif self.mode == "budget" and floor is not None:
                    self._cut_on_a_floor(floor, ran)
                if floor is None:
                    self._last_floor = None
                self._tenant_step = False
        dominant = self._dominant(work)
        row = {
            "t": now, "mode": self.mode, "phase": phase, "budget_w": self.budget_w, "setpoint_w": self.setpoint_w,
            "margin": self.margin, "power_w": reading.power_w, "power_filtered_w": self.power_filtered,
            "energy_mj": reading.energy_mj, "temp_c": reading.temp_c, "sm_clock_mhz": reading.sm_clock_mhz,
            "clock_reasons": reading.clock_reasons, "duty": self.loop.duty,
            # (a reading that averages a window of pacing cycles: the duty realized in it, and its length)
            "reading_duty": reading.duty, "reading_paced_duty": reading.paced_duty,
            "reading_window_s": reading.window_s, "gpu_util_pct": reading.gpu_util_pct, "offset_w": self.offset_w,
            "table_share": self.table_share, "noise_share": self.noise.share,
            "aim_w": self._aim_w() if self.mode == "budget" and self.budget_w is not None else None,
            "temp_limit_c": self.thermal.limit_c if self.thermal is not None else None,
            "thermal_cap_w": self.thermal.cap_w if self.thermal is not None else None,
            "config": dominant.label if dominant else None, "choice": self._choice_label(),
            "configs": len(work.by_key),
            "calls": sum(c for c, _ in work.by_key.values()), "tokens": work.tokens, "tokens_per_s": tokens_per_s,
            "telemetry_ok": not stale, "telemetry_error": reading.error, "event": "; ".join(self._events) or None,
        }
        self._events = []
        return row

    def _waking(self, now: float, power: float) -> bool:
        """Whether this reading shows the idle board in the run's first WAKE_S with our calls
        on it (the module's WAKE_S). Not a reading that averages a window of a step's pacing
        cycles (flashwatt.control.window_readings): its idle share is the pacing's sleep."""
        if not self.shapes or self.idle_w is None or self._window is not None or self._awake:
            return False
        if self._first_work_t is None:
            self._first_work_t = now
        # (once a reading has shown our watts, an idle one is the pacing's sleep, a real reading)
        self._awake = now - self._first_work_t >= WAKE_S or power - self.idle_w >= MIN_ABOVE_W
        return not self._awake

    def _choice_label(self) -> str | None:
        """The one shape's choice (a re-check runs another configuration without changing it)."""
        states = list(self.shapes.values())
        return states[0].choice.label if len(states) == 1 else None

    def _phase(self) -> str:
        phases = {s.phase for s in list(self.shapes.values())}
        if phases & {PROBE, EXPLORE}:
            return "explore"
        return "recheck" if RECHECK in phases else "exploit"

    def _learn(self, work: Work, power: float | None, tokens_per_s: float) -> None:
        """Fold one tick into the model: only ticks whose power belongs to one (shape,
        configuration), following a tick of the same, so a switch's transient is not learned;
        ticks of several shapes teach the table of the mix (the feed-forward while they share
        the GPU)."""
        single = next(iter(work.by_key)) if len(work.by_key) == 1 else None
        shapes = {shape for shape, _ in work.by_key}
        if shapes:
            if self._several_shapes != (len(shapes) > 1):
                self._fresh_table_t = self.clock()  # the mix's table takes over, or gives back
            self._several_shapes = len(shapes) > 1
        for shape in shapes:
            state = self.shapes.get(shape)
            if state is not None:
                state.seen_ticks += 1
                state.alone_ticks += single is not None
        # The reading of this tick may have been sampled up to a tick ago: it shows the duty
        # set two ticks back as much as the last one, so both must agree.
        steady_duty = abs(self.loop.duty - self._last_duty) < 0.03 and abs(self._last_duty - self._prev_duty) < 0.03
        same = single is not None and single == self._last_single
        self._last_single, self._prev_duty, self._last_duty = single, self._last_duty, self.loop.duty
        if power is None or self.idle_w is None or self.mode == "static":
            return
        if self._window is not None:  # a window of pacing cycles (flashwatt.control.window_readings)
            self._learn_window(power)
            return
        self._record_counter(self.model.power.get(single) if single is not None else (
            self.model.mix_power if len(shapes) > 1 and self.model.mix_power.bins else None))
        if same:
            table = self.model.power.get(single)
        elif len(shapes) > 1:
            table = self.model.mix_power
        else:
            return
        # While the duty moves, the reading may still show part of the duty before: only a step
        # too large for that (a tenant that left) is taken, and nothing is learned.
        if not self._observe(power, table, steady_duty) or not steady_duty:
            return
        if self._others_present():
            return
        # The energy counter over the last ticks at this duty knows the board's power better
        # than this one reading; without it (a counter that fails or stalls, a duty that
        # just moved), the reading.
        counted = self._counter_power(table)
        ours = (counted if counted is not None else power) - self.offset_w
        if single is None:
            table.add(self.loop.duty, ours)
            return
        board = ours + self.offset_w
        near_setpoint = self.setpoint_w is not None and abs(board - self.setpoint_w) <= 0.1 * self.setpoint_w
        self.model.add_tick(*single, tokens_per_s, ours, self.idle_w, self.loop.duty,
                            comparable=near_setpoint or self.loop.duty >= 0.98)

    def _decide(self, now: float) -> None:
        """Per tick: advance re-checks, start one when due, and compare configurations once
        the loop has settled (in a transient the model's latest samples are the least
        trustworthy)."""
        settled = self._settled(now)
        for shape, state in list(self.shapes.items()):
            if state.phase == RECHECK:
                self._advance_recheck(shape, state, now)
            elif state.phase == EXPLOIT and settled:
                if now >= state.next_recheck_t:
                    self._maybe_recheck(shape, state, now)
                else:
                    self._choose(shape, state, now)

    def _adapt_margin(self, now: float, joules: float | None) -> None:
        """Set the set point's margin under the budget from how the 1 s averages of power (the
        quantity a budget is judged by, from the energy counter) fall about what the loop
        aimed at: their mean and MARGIN_SIGMAS standard deviations over it stay under the
        budget's tolerance (about 0.6% of windows over it). Until MARGIN_EARNED_AFTER of them
        have been seen at this budget the margin is at least the base margin; after, it is
        what they ask for: the board's own scatter (on the H100 1-2% of the budget) needs
        little or none, and a margin it does not need costs throughput in proportion (at
        450 W, 2% of the budget is 3% of the watts above idle). A bursty tenant widens it,
        up to max_margin. Windows that hold a budget step, any move of a ramp or a switch of ours
        are left out."""
        if joules is None or self.mode != "budget" or self.budget_w is None:
            return
        self._energy.append((now, joules, self._aim_w()))
        self._update_debt(now)
        older = [(t, j) for t, j, _ in self._energy if t <= now - 1.0]
        if not older:
            return
        t0, j0 = older[-1]
        # A window over a budget that moved (a ramp) shows how far the loop lags the ramp, not
        # how the board scatters; kept, the lag of one ramp down widened the margin for the rest
        # of the run (on an H200 from 2 % to 6.7 % of a 650 W budget after it: 30 W never drawn).
        quiet = (self._quiet_since is None or t0 >= self._quiet_since) and t0 >= self._budget_moved_t \
            and not self._stall_in(t0, now)  # (a stall of our work is no scatter of the board's either)
        if quiet and now > t0:
            # the window's power about what the loop aimed at (a ramp, a debt move both)
            aimed = statistics.fmean(aim for t, _, aim in self._energy if t > t0)
            self._window_w.append((joules - j0) / (now - t0) - aimed)
        if len(self._window_w) >= 10:
            over = statistics.fmean(self._window_w) + MARGIN_SIGMAS * statistics.pstdev(self._window_w)
            wanted = over / self.budget_w - WINDOW_TOLERANCE
            floor = 0.0 if len(self._window_w) >= MARGIN_EARNED_AFTER else self.base_margin
            self.margin = min(self.max_margin, max(floor, wanted))

    def _settled(self, now: float) -> bool:
        """Power within 5% of what the loop aims at (or two deviations of the filtered readings)
        for the last second, and the unexplained watts on the board steady for as long (while
        another tenant comes or goes, the model's attribution is uncertain; a steady offset is
        taken out of every prediction alike); energy mode: always."""
        if self.mode != "budget":
            return True
        if now - self._offset_moved_t < 1.0:  # the others' watts moved: attribution is uncertain
            self._settled_since = None
            return False
        # (the filtered readings scatter too: a band of two of their deviations at least)
        band = max(0.05 * self.setpoint_w, 2.0 * FILTERED_SPREAD * self.noise.sigma_w(self.setpoint_w))
        if self.power_filtered is None or abs(self.power_filtered - self._aim_w()) > band:
            self._settled_since = None
            return False
        if self._settled_since is None:
            self._settled_since = now
        return now - self._settled_since >= 1.0

    def _dominant(self, work: Work) -> Configuration | None:
        if not work.by_key:
            states = list(self.shapes.values())
            return states[0].config if len(states) == 1 else None
        (shape, config), _ = max(work.by_key.items(), key=lambda kv: kv[1][1])
        return config

    def _resume(self, now: float) -> None:
        """Readings are back: each shape returns to its choice from before the fallback, at
        the duty its table gives (bounded), and the loop takes over."""
        self._events.append("telemetry back: control resumed")
        self.fallback_reason = None
        self.loop.reset()
        fresh_since = self._fresh_table_t
        for shape, state in list(self.shapes.items()):
            if state.before_fallback is not None and state.before_fallback not in state.forbidden:
                state.choice = state.before_fallback
                state.run(state.choice, now, self._samples(shape, state.choice))
                if not self._several_shapes:
                    self._duty_for_switch(shape, state.choice)
            state.before_fallback = None
        # The tables that run again ran before the gap, with the share learned then, and the
        # frugal fallback left the board cooler: they need no margin of a fresh table (on the
        # simulated H100 it cost 2% of a run's throughput after a 2.5 s gap).
        self._fresh_table_t = fresh_since

    def _enter_fallback(self) -> None:
        """The most frugal operating point known: lowest power seen, else the lowest duty; and
        never above the duty at which the power prior, with the others' watts last seen, is
        within the set point (the lowest power seen may be over the budget now)."""
        # What the readings showed before the gap holds for the duty before it: the counter's
        # windows, the filtered power and the last second's readings start again after it (a
        # window across it compared the fallback's joules with what the tables predict at the
        # duties before, and took the board for a quarter cooler than it was; the filtered
        # power from before held back watts after a budget step down as if drawn just then)
        self._counter_seen = []
        self.power_filtered = None
        self._recent_w.clear()
        best = None
        for (_, config), table in list(self.model.power.items()):
            for b, p in list(table.bins.items()):
                if best is None or p < best[0]:
                    best = (p, config, (b - 0.5) / DUTY_BINS)  # the low edge of the bin
        now = self.clock()
        if best is not None:
            _, config, duty = best
            for state in list(self.shapes.values()):
                if config not in state.forbidden:
                    if not state.exploring:
                        state.before_fallback = state.choice
                    state.phase, state.choice, state.to_probe, state.to_explore = EXPLOIT, config, [], []
                    state.recheck_every_s = self.recheck_after_s
                    state.next_recheck_t = now + self.recheck_after_s
                    state.run(config, now, 0)
            if self.idle_w is not None and self.setpoint_w is not None:
                duty = min(duty, prior_duty(self.setpoint_w - max(0.0, self.offset_w), self.idle_w, self.limit_w,
                                            self.loop.d_min, self.loop.d_max))
            self.loop.reset(max(self.loop.d_min, duty))
        else:
            self.loop.reset(self.loop.d_min)
        self._events.append(f"fallback: {self.fallback_reason}")
