"""The decisions of the power-aware controller, free of torch and of NVML.

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

Stability: a shape explores each candidate for a short dwell, then keeps its choice for at
least `dwell_s` and switches only for a predicted gain above `hysteresis`, so two
configurations of near-equal merit never alternate. A budget change re-decides at once.

Telemetry failure: when no valid reading arrives for `stale_s`, the governor falls back to
the most frugal operating point it knows (the configuration and duty with the lowest power
seen, else the lowest duty), says why in the trace, and resumes once readings return.
"""
from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.control.duty_loop import DutyLoop
from flashwatt.control.model import DUTY_BINS, OnlineModel

MODES = ("budget", "energy", "static")


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


@dataclass
class ShapeState:
    candidates: list[Configuration]
    config: Configuration
    to_explore: list[Configuration]
    since: float  # when `config` became this shape's choice
    forbidden: dict[Configuration, str] = field(default_factory=dict)
    pruned: set[Configuration] = field(default_factory=set)  # too slow to be worth a power dwell
    exploring: bool = True


class Governor:
    def __init__(self, mode: str, candidates: list[Configuration] | Callable[[tuple], list[Configuration]], *, budget_w: float | None = None,
                 idle_w: float | None = None, limit_w: float | None = None, max_slowdown: float | None = None,
                 static_duty: float = 1.0, margin: float = 0.02, max_margin: float = 0.08, dwell_s: float = 3.0,
                 explore_dwell_s: float = 0.6, prune_below: float = 0.4, hysteresis: float = 0.05, stale_s: float = 0.5,
                 duty_range: tuple[float, float] = (0.05, 1.0), clock: Callable[[], float] = time.monotonic):
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
        self.mode = mode
        self.candidates_for = candidates
        self.idle_w = idle_w
        self.limit_w = limit_w
        self.max_slowdown = max_slowdown
        self.base_margin = margin
        self.max_margin = max_margin
        self.margin = margin  # base_margin, widened while 1 s averages of power spread (see _adapt_margin)
        self._energy: collections.deque = collections.deque(maxlen=40)  # (t, joules) from the counter
        self._window_w: collections.deque = collections.deque(maxlen=30)  # 1 s averages, one per tick
        self._quiet_since: float | None = None  # windows from here on hold no step of ours
        self.dwell_s = dwell_s
        self.explore_dwell_s = explore_dwell_s
        self.prune_below = prune_below
        self.hysteresis = hysteresis
        self.stale_s = stale_s
        self.clock = clock
        self.model = OnlineModel()
        self.shapes: dict[tuple, ShapeState] = {}
        gain = (limit_w - idle_w) if (limit_w and idle_w is not None and limit_w > idle_w) else 500.0
        self.loop = DutyLoop(plant_gain_w=gain, d_min=duty_range[0], d_max=duty_range[1])
        self.loop.duty = static_duty if mode == "static" else duty_range[1]
        self.budget_w = None
        if budget_w is not None:
            self.set_budget(budget_w)
            if mode == "budget":
                self.loop.duty = self._start_duty()  # start low, let the loop climb
        self.power_filtered: float | None = None
        self._settled_since: float | None = None
        self.offset_w = 0.0  # watts on the board that no configuration of ours explains
        self.last_valid_t: float | None = None
        self.fallback_reason: str | None = None
        self._last_tick_t: float | None = None
        self._last_single: tuple | None = None  # the (shape, config) of the last tick, if only one ran
        self._last_duty = self.loop.duty
        self._events: list[str] = []

    # ---- settings ----------------------------------------------------------------------
    def set_budget(self, budget_w: float) -> None:
        budget_w = float(budget_w)
        if self.idle_w is not None and budget_w <= self.idle_w:
            raise ControlError(f"budget {budget_w:.0f} W is at or under this GPU's idle power "
                               f"({self.idle_w:.0f} W): no workload fits")
        if self.limit_w is not None and budget_w > self.limit_w:
            raise ControlError(f"budget {budget_w:.0f} W is over this GPU's enforced power limit "
                               f"({self.limit_w:.0f} W); the card cannot draw more than the limit")
        changed = self.budget_w is not None and budget_w != self.budget_w
        self.budget_w = budget_w
        if changed:
            self._events.append(f"budget {budget_w:.0f} W")
            self.loop.hold()
            self._window_w.clear()  # spread around the old budget says nothing of the new one
            self._quiet_since = self.clock()
            now = self.clock()
            for shape, state in list(self.shapes.items()):
                if not state.exploring:
                    self._choose(shape, state, now, skip_dwell=True)

    @property
    def setpoint_w(self) -> float | None:
        return None if self.budget_w is None else self.budget_w * (1 - self.margin)

    @property
    def duty(self) -> float:
        return self.loop.duty

    # ---- per call ----------------------------------------------------------------------
    def config_for(self, shape: tuple) -> Configuration:
        state = self.shapes.get(shape)
        if state is None:
            state = self._new_shape(shape)
        elif state.exploring:
            self._advance_exploration(shape, state)
        return state.config

    def on_latency(self, shape: tuple, config: Configuration, seconds: float, tokens: int) -> None:
        self.model.add_latency(shape, config, seconds, tokens)

    def forbid(self, shape: tuple, config: Configuration, reason: str) -> None:
        """A configuration this shape must not use (e.g. its precision failed the check)."""
        state = self.shapes.get(shape) or self._new_shape(shape)
        state.forbidden[config] = reason
        self._events.append(f"refused {config.label}: {reason}")
        if config in state.to_explore:
            state.to_explore.remove(config)
        if state.config == config:
            if state.exploring:
                self._advance_exploration(shape, state, force=True)
            else:
                self._choose(shape, state, self.clock(), force=True)

    def _new_shape(self, shape: tuple) -> ShapeState:
        now = self.clock()
        candidates = list(self.candidates_for(shape))
        if not candidates:
            raise ControlError(f"no configuration can run shape {shape}")
        if self.mode == "static":
            state = ShapeState(candidates, candidates[0], [], now, exploring=False)
        else:
            state = ShapeState(candidates, candidates[0], list(candidates[1:]), now)
        self.shapes[shape] = state
        return state

    def _advance_exploration(self, shape: tuple, state: ShapeState, force: bool = False) -> None:
        now = self.clock()
        stats = self.model.stats.get((shape, state.config))
        # Explored: its GPU time sampled, and (for a shape that runs alone) its power seen at
        # a comparable operating point, so every candidate is ranked by the same yardstick;
        # a shape mixed with others (power not attributable) moves on after 3 dwells.
        power_seen = stats is not None and (stats.j_samples if self.mode == "energy" else stats.eta_samples) >= 3
        measured = stats is not None and stats.latency_samples >= 2
        dwelt = now - state.since
        if measured and not force and self._too_slow(shape, stats):
            # Its GPU time alone rules it out: no need to wait for its power.
            state.pruned.add(state.config)
            self._events.append(f"prune {state.config.label} ({stats.tokens_per_s_full:.4g} tokens/s at full duty, "
                                f"under {self.prune_below:g} x the fastest explored)")
            force = True
        if not force and not (measured and ((power_seen and dwelt >= self.explore_dwell_s)
                                            or dwelt >= 3 * self.explore_dwell_s)):
            return
        while state.to_explore:
            nxt = state.to_explore.pop(0)
            if nxt not in state.forbidden:
                state.config, state.since = nxt, now
                self._duty_for_switch(nxt)
                return
        state.exploring = False
        self._choose(shape, state, now, force=True)

    def _too_slow(self, shape: tuple, stats) -> bool:
        """Whether a configuration's full-duty throughput is under `prune_below` (0.4) of the
        fastest one explored for this shape. To be worth choosing, such a configuration
        would have to draw well under half the watts above idle of the faster one; on the
        boards measured the slow ones (a 33-CTA cap, the memory-efficient backend, at 0.28-0.35x
        cuDNN's throughput) drew 0.68x and more (docs/control.md), so their power dwell only
        costs exploration time. A frugal configuration that is merely slower (0.6x) is
        still explored in full."""
        speeds = [st.tokens_per_s_full for (sh, _), st in list(self.model.stats.items())
                  if sh == shape and st.tokens_per_s_full is not None and st.latency_samples >= 2]
        return (stats.tokens_per_s_full is not None and bool(speeds)
                and stats.tokens_per_s_full < self.prune_below * max(speeds))

    def _score(self, shape: tuple, config: Configuration, use_eta: bool) -> float | None:
        stats = self.model.stats.get((shape, config))
        if stats is None or stats.tokens_per_s_full is None:
            return None
        if self.mode == "energy":
            if use_eta and stats.j_per_token:
                return -stats.j_per_token
            return stats.tokens_per_s_full
        if use_eta and self.setpoint_w is not None and self.idle_w is not None:
            return self.model.throughput_at(shape, config, self.setpoint_w - self.offset_w, self.idle_w)
        return stats.tokens_per_s_full

    def _choose(self, shape: tuple, state: ShapeState, now: float, force: bool = False,
                skip_dwell: bool = False) -> None:
        allowed = [c for c in state.candidates if c not in state.forbidden and c not in state.pruned
                   and self.model.stats.get((shape, c)) is not None
                   and self.model.stats[(shape, c)].tokens_per_s_full is not None]
        if not allowed:
            return
        if self.mode == "energy" and self.max_slowdown is not None:
            fastest = max(self.model.stats[(shape, c)].tokens_per_s_full for c in allowed)
            allowed = [c for c in allowed
                       if self.model.stats[(shape, c)].tokens_per_s_full >= (1 - self.max_slowdown) * fastest]
        # Power is attributable only where a tick ran this shape alone; rank every candidate
        # by the same yardstick, so use it only if all of them have it.
        key = "j_samples" if self.mode == "energy" else "eta_samples"
        use_eta = all(getattr(self.model.stats[(shape, c)], key) > 0 for c in allowed)
        scores = {c: self._score(shape, c, use_eta) for c in allowed}
        best = max(allowed, key=lambda c: scores[c])
        current = state.config
        if best == current:
            return
        if not force:
            if now - state.since < self.dwell_s and not skip_dwell:
                return
            cur = scores.get(current)
            if cur is not None and scores[best] <= cur * (1 + self.hysteresis):
                return
        state.config, state.since = best, now
        self._duty_for_switch(best)
        unit = "J/token" if self.mode == "energy" and use_eta else "tokens/s"
        ranked = sorted(allowed, key=lambda c: scores[c], reverse=True)[:3]
        self._events.append(f"choose {best.label} (" + ", ".join(
            f"{c.label} {abs(scores[c]):.4g}" for c in ranked) + f" {unit})")

    # ---- per tick ----------------------------------------------------------------------
    def tick(self, reading: Reading, work: Work) -> dict:
        """Take one reading and the work since the last tick; set the duty; return a trace row."""
        now = reading.t
        dt = 0.1 if self._last_tick_t is None else max(1e-3, now - self._last_tick_t)
        self._last_tick_t = now
        power = reading.power_w
        self._adapt_margin(now, reading.energy_mj)
        if power is not None:
            self.last_valid_t = now
            self.power_filtered = power if self.power_filtered is None else 0.3 * self.power_filtered + 0.7 * power
        tokens_per_s = work.tokens / dt
        single = next(iter(work.by_key)) if len(work.by_key) == 1 else None

        # The model learns only from ticks whose power belongs to one (shape, config) and
        # that follow a tick of the same, so a switch's transient is not attributed.
        steady_duty = abs(self.loop.duty - self._last_duty) < 0.03
        if (power is not None and single is not None and single == self._last_single and steady_duty
                and self.idle_w is not None and self.mode != "static"):
            shape, config = single
            # Watts the model cannot explain at a duty it knows belong to something else on
            # the board (another tenant, warming up): tracked as an offset common to every
            # configuration, so that a disturbance is neither learned as this configuration's
            # cost nor makes another one look cheaper.
            table = self.model.power.get(config)
            expected = table.power_at(self.loop.duty, self.idle_w) if table is not None else None
            if expected is not None:
                self.offset_w += 0.3 * ((power - expected) - self.offset_w)
            near_setpoint = self.setpoint_w is not None and abs(power - self.setpoint_w) <= 0.1 * self.setpoint_w
            self.model.add_tick(shape, config, tokens_per_s, power - self.offset_w, self.idle_w, self.loop.duty,
                                comparable=near_setpoint or self.loop.duty >= 0.98)
        self._last_single = single
        self._last_duty = self.loop.duty

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
                    self._events.append("telemetry back: control resumed")
                    self.fallback_reason = None
                    self.loop.reset()
                phase = "explore" if any(s.exploring for s in list(self.shapes.values())) else "exploit"
                # Configurations are compared only once the loop has settled: in a transient
                # the model's latest samples are the least trustworthy.
                if self._settled(now):
                    for shape, state in list(self.shapes.items()):
                        if not state.exploring:
                            self._choose(shape, state, now)
                if self.mode == "budget" and self.power_filtered is not None:
                    config = self._dominant(work)
                    table = self.model.power.get(config) if config else None
                    # The feed-forward reads the table of our own watts at the set point; the
                    # integral carries the rest (other tenants), so nothing is counted twice.
                    ff = table.duty_for(self.setpoint_w, self.idle_w) if table and self.idle_w is not None else None
                    self.loop.update(self.setpoint_w, self.power_filtered, dt, ff)
        dominant = self._dominant(work)
        row = {
            "t": now,
            "mode": self.mode,
            "phase": phase,
            "budget_w": self.budget_w,
            "setpoint_w": self.setpoint_w,
            "margin": self.margin,
            "power_w": power,
            "power_filtered_w": self.power_filtered,
            "energy_mj": reading.energy_mj,
            "temp_c": reading.temp_c,
            "sm_clock_mhz": reading.sm_clock_mhz,
            "clock_reasons": reading.clock_reasons,
            "duty": self.loop.duty,
            "offset_w": self.offset_w,
            "config": dominant.label if dominant else None,
            "configs": len(work.by_key),
            "calls": sum(c for c, _ in work.by_key.values()),
            "tokens": work.tokens,
            "tokens_per_s": tokens_per_s,
            "telemetry_ok": not stale,
            "telemetry_error": reading.error,
            "event": "; ".join(self._events) or None,
        }
        self._events = []
        return row

    def _adapt_margin(self, now: float, energy_mj: float | None) -> None:
        """Widen the set point's margin under the budget while the 1 s averages of power (the
        quantity a budget is judged by, from the energy counter) spread: with a bursty
        tenant on the board the loop cannot cancel every burst, and a set point 1.645
        standard deviations under the budget keeps about 95% of windows within it.
        Windows that hold a budget step or a switch of ours are left out."""
        if energy_mj is None or self.mode != "budget" or self.budget_w is None:
            return
        self._energy.append((now, energy_mj / 1e3))
        older = [(t, j) for t, j in self._energy if t <= now - 1.0]
        if not older:
            return
        t0, j0 = older[-1]
        quiet = self._quiet_since is None or t0 >= self._quiet_since
        if quiet and now > t0:
            self._window_w.append((energy_mj / 1e3 - j0) / (now - t0))
        if len(self._window_w) >= 10:
            spread = statistics.pstdev(self._window_w)
            self.margin = min(self.max_margin, max(self.base_margin, 1.645 * spread / self.budget_w))

    def _start_duty(self) -> float:
        """Half the duty a linear power curve would give for the set point: measured curves
        are concave (more watts per unit of duty at low duty), so this starts under budget."""
        share = (self.setpoint_w - (self.idle_w or 0.0)) / self.loop.plant_gain_w
        return min(self.loop.d_max, max(self.loop.d_min, 0.5 * share))

    def _duty_for_switch(self, config: Configuration) -> None:
        """Bumpless for power: a configuration starts at the duty its own table gives for the
        set point, or, never seen, at the cautious start duty if that is lower than now."""
        if self.mode != "budget":
            return
        table = self.model.power.get(config)
        if table is not None and self.idle_w is not None:
            # The table holds our own watts; the loop's integral has been carrying the rest
            # (another tenant, the table's error: offset_w). Start where our watts plus those
            # meet the set point, and keep the integral at that difference, so neither the
            # switch nor the end of the hold drops the compensation.
            self._quiet_since = self.clock()
            duty = table.duty_for(self.setpoint_w - max(0.0, self.offset_w), self.idle_w)
            ff = table.duty_for(self.setpoint_w, self.idle_w)
            if duty is not None:
                self.loop.reset(duty)
                self.loop.integral = self.loop.duty - ff if ff is not None else 0.0
                self.loop.hold()
                return
        self._quiet_since = self.clock()
        self.loop.reset(min(self.loop.duty, self._start_duty()))
        self.loop.hold()

    def _settled(self, now: float) -> bool:
        """Power within 5% of the set point for the last second, and no unexplained watts on
        the board (another tenant makes the model's attribution uncertain); energy mode:
        always."""
        if self.mode != "budget":
            return True
        if abs(self.offset_w) > 0.05 * self.setpoint_w:
            self._settled_since = None
            return False
        if self.power_filtered is None or abs(self.power_filtered - self.setpoint_w) > 0.05 * self.setpoint_w:
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

    def _enter_fallback(self) -> None:
        """The most frugal operating point known: lowest power seen, else the lowest duty."""
        best = None
        for config, table in list(self.model.power.items()):
            for b, p in list(table.bins.items()):
                if best is None or p < best[0]:
                    best = (p, config, (b - 0.5) / DUTY_BINS)  # the low edge of the bin
        if best is not None:
            _, config, duty = best
            for state in list(self.shapes.values()):
                if config not in state.forbidden:
                    state.config, state.exploring, state.to_explore = config, False, []
            self.loop.reset(max(self.loop.d_min, duty))
        else:
            self.loop.reset(self.loop.d_min)
        self._events.append(f"fallback: {self.fallback_reason}")
