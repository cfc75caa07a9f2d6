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

Each shape goes through probe, explore, exploit and, now and then, recheck
(flashwatt.control.shape_state). Exploration is bounded: a configuration is tried only at a
duty whose predicted power (flashwatt.control.power_bound), with the watts of other tenants,
is within the set point; one that would exceed it even at the lowest duty is deferred.

Stability: a choice is kept for at least `dwell_s` and changes only for a predicted gain
above `hysteresis`, so two configurations of near-equal merit never alternate. A budget
step (a change of STEP_MIN_W or more) re-decides at once and moves the duty at once, from
the configuration's duty -> power table; smaller changes (a ramp) are tracked by the loop.

Telemetry failure: when no valid reading arrives for `stale_s`, the governor falls back to
the most frugal operating point it knows (the configuration and duty with the lowest power
seen, else the lowest duty), says why in the trace, and resumes once readings return.
Ticks without a reading leave the duty where it is (the loop does not integrate an old error).
"""
from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from flashwatt.control.budget_schedule import STEP_MIN_W
from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.control.duty_loop import DutyLoop
from flashwatt.control.model import DUTY_BINS, OnlineModel
from flashwatt.control.power_bound import PRIOR_EXPONENT, bounded_duty, predicted_power, prior_duty
from flashwatt.control.shape_state import EXPLOIT, EXPLORE, PROBE, RECHECK, ShapeState

MODES = ("budget", "energy", "static")
# Latency samples that measure a configuration's GPU time in the probe (the controller
# times a configuration's first calls synchronously and drops the very first).
PROBE_SAMPLES = 2
# Fresh power samples (ticks at a comparable operating point) that end a dwell.
DWELL_SAMPLES = 3
# A candidate predicted this much below the best one explored is left early.
EARLY_DROP = 0.15
# A reading this far over the budget (and three times the readings' noise, up to
# NOISE_ALLOWANCE of the budget) is cut at once (Governor._cut_overshoot); the noise is
# estimated from deviations of at most NOISE_CLIP_W.
OVERSHOOT_CUT = 0.02
NOISE_CLIP_W = 20.0
NOISE_ALLOWANCE = 0.03  # of the budget, at most, for the readings' noise
# The model learns from a tick only while the estimate of the watts it cannot explain moved
# less than this (or twice the readings' noise) in the tick.
OFFSET_SETTLED_W = 5.0
# A change of the unexplained watts this large in one tick is a tenant arriving or leaving.
TENANT_STEP_W = 25.0
# Energy drawn over the budget in the last second is repaid over this long, by at most this
# share of the budget (Governor._aim_w).
DEBT_REPAY_S = 0.5
DEBT_MAX = 0.15
# Others' watts over this share of the set point (of the power in energy mode): the model
# learns nothing (Governor._others_present).
OTHERS_PRESENT = 0.05
# While the others' watts are over this share of the set point, a shape keeps its choice.
OTHERS_HOLD_CHOICE = 0.10
# For this long after a switch, a difference between power and the table is the table's to
# learn, not the others' watts.
TABLE_FIRST_S = 1.0
# Readings this soon after a budget step or a switch still show the power from before it.
STALE_AFTER_CHANGE_S = 0.25
# After a budget step, the runner-up is re-checked this soon (once the loop has settled).
RECHECK_AFTER_STEP_S = 1.5
# Refusals a warm start carries over: those of the backend, not a precision check's (which
# depends on the inputs; flashwatt.control.controller).
PRECISION_REFUSAL = "precision check"
EARLIER_REFUSAL = "refused in an earlier run: "
# A mixed shape's warm-start entry keeps the table of the mix it ran in under this label.
MIX_TABLE = "(mix)"


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


class Governor:
    def __init__(self, mode: str, candidates: list[Configuration] | Callable[[tuple], list[Configuration]], *,
                 budget_w: float | None = None, idle_w: float | None = None, limit_w: float | None = None,
                 max_slowdown: float | None = None, static_duty: float = 1.0, margin: float = 0.02,
                 max_margin: float = 0.08, dwell_s: float = 3.0, explore_dwell_s: float = 0.6,
                 prune_below: float = 0.4, hysteresis: float = 0.05, stale_s: float = 0.5,
                 duty_range: tuple[float, float] = (0.01, 1.0), recheck_after_s: float = 4.0,
                 recheck_max_s: float = 32.0, recheck_within: float = 0.85, warm_start=None,
                 clock: Callable[[], float] = time.monotonic):
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
        self._energy: collections.deque = collections.deque(maxlen=40)  # (t, joules, set point, budget)
        self._debt_j = 0.0  # energy the last second drew over its budget (see _aim_w)
        self._window_w: collections.deque = collections.deque(maxlen=30)  # 1 s averages less the set point, one per tick
        self._quiet_since: float | None = None  # windows from here on hold no step of ours
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
        self.offset_w = 0.0  # watts on the board that no configuration of ours explains
        self._events: list[str] = []
        self._last_single: tuple | None = None  # the (shape, config) of the last tick, if only one ran
        self._several_shapes = False  # the last tick with work ran several shapes
        self._tenant_step = False  # this tick saw a step in the watts of others
        self._offset_moved_t = -float("inf")  # when the estimate of the others' watts last moved
        if budget_w is not None:
            self.set_budget(budget_w)
            if mode == "budget":
                self.loop.duty = self._start_duty()  # start low, let the loop climb
        self.power_filtered: float | None = None
        self._noise_w = 0.0  # mean absolute deviation of readings from the filtered power
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
        if before is None or abs(budget_w - before) < STEP_MIN_W:
            return
        now = self.clock()
        self._events.append(f"budget {budget_w:.0f} W")
        if self.fallback_reason is not None:
            return  # blind: the frugal fallback holds until readings return, whatever the budget
        self.loop.hold()
        self._window_w.clear()  # spread around the old budget says nothing of the new one
        self._quiet_since = now
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

    # ---- a shape's phases ---------------------------------------------------------------
    def _new_shape(self, shape: tuple) -> ShapeState:
        now = self.clock()
        candidates = list(self.candidates_for(shape))
        if not candidates:
            raise ControlError(f"no configuration can run shape {shape}")
        state = ShapeState(candidates, candidates[0], candidates[0], now)
        self.shapes[shape] = state
        if self.mode == "static":
            state.phase = EXPLOIT
        elif not self._warm_start(shape, state, now):
            state.to_probe = list(candidates)
            if self.mode == "budget" and not self._several_shapes:
                self.loop.duty = min(self.loop.duty, self._start_duty())  # the probe runs within the bound too
        return state

    def _warm_start(self, shape: tuple, state: ShapeState, now: float) -> bool:
        """Begin at the operating point a cache entry gives, if it covers every candidate."""
        entry = self.warm_start.lookup(shape) if self.warm_start is not None else None
        if entry is None:
            return False
        known, refused = entry["stats"], entry.get("refused", {})
        if any(c.label not in refused and (c.label not in known or known[c.label].tokens_per_s_full is None)
               for c in state.candidates):
            return False  # a candidate it never measured: explore as from nothing
        for config in state.candidates:
            if config.label in refused:
                state.forbidden[config] = EARLIER_REFUSAL + refused[config.label]
            else:
                self.model.stats[(shape, config)] = known[config.label]
                if config.label in entry["power"]:
                    self.model.power[(shape, config)] = entry["power"][config.label]
        state.pruned = {c for c in state.candidates if c not in state.forbidden
                        and self._too_slow(shape, self.model.stats[(shape, c)])}
        state.phase, state.warm = EXPLOIT, True
        state.recheck_every_s = self.recheck_after_s
        state.next_recheck_t = now + self.recheck_after_s
        self._events.append(f"warm start: {len(known)} configurations from {entry.get('runs', 0)} earlier run(s)")
        if entry.get("mixed"):
            # It ran mixed with other shapes: the duty is the mix's, not its own table's.
            self._several_shapes = True
            if not self.model.mix_power.bins and MIX_TABLE in entry["power"]:
                self.model.mix_power = entry["power"][MIX_TABLE]
        if not self._choose(shape, state, now, force=True) and not self._several_shapes:
            self._duty_for_switch(shape, state.config)
        return True

    def _advance(self, shape: tuple, state: ShapeState) -> None:
        if state.phase == PROBE:
            self._advance_probe(shape, state)
        elif state.phase == EXPLORE:
            self._advance_exploration(shape, state)
        elif state.phase == RECHECK:
            self._advance_recheck(shape, state, self.clock())

    def _advance_probe(self, shape: tuple, state: ShapeState) -> None:
        """Each candidate for a few timed calls, one after another."""
        while state.to_probe:
            config = state.to_probe[0]
            stats = self.model.stats.get((shape, config))
            if config in state.forbidden or (stats is not None and stats.latency_samples >= PROBE_SAMPLES):
                state.to_probe.pop(0)
                continue
            if state.config != config:
                state.run(config, self.clock(), 0)
            return
        self._finish_probe(shape, state)

    def _finish_probe(self, shape: tuple, state: ShapeState) -> None:
        """Rank the candidates by GPU time: drop the much slower, explore the rest fastest first."""
        now = self.clock()
        timed = [c for c in state.candidates if c not in state.forbidden
                 and self.model.stats.get((shape, c)) is not None
                 and self.model.stats[(shape, c)].tokens_per_s_full is not None]
        timed.sort(key=lambda c: self.model.stats[(shape, c)].tokens_per_s_full, reverse=True)
        for config in timed[1:]:
            stats = self.model.stats[(shape, config)]
            if self._too_slow(shape, stats):
                state.pruned.add(config)
                self._events.append(f"prune {config.label} ({stats.tokens_per_s_full:.4g} tokens/s at full duty, "
                                    f"under {self.prune_below:g} x the fastest explored)")
        state.phase = EXPLORE
        state.to_explore = [c for c in timed if c not in state.pruned]
        self._next_candidate(shape, state, now)

    def _next_candidate(self, shape: tuple, state: ShapeState, now: float) -> None:
        """Start the next candidate that the power bound allows; end exploration when none is left."""
        while state.to_explore:
            config = state.to_explore.pop(0)
            if config not in state.forbidden and self._try(shape, state, config, now):
                return
        self._end_exploration(shape, state, now)

    def _advance_exploration(self, shape: tuple, state: ShapeState, force: bool = False) -> None:
        now = self.clock()
        if state.mixed:
            # Its power is never attributable: GPU time per token is all there is to rank by.
            state.to_explore.clear()
            self._end_exploration(shape, state, now)
            return
        stats = self.model.stats.get((shape, state.config))
        measured = stats is not None and stats.latency_samples >= PROBE_SAMPLES
        fresh = self._samples(shape, state.config) - state.samples_at_start
        dwelt = now - state.since
        if not force and measured and fresh >= DWELL_SAMPLES - 1 and self._clearly_worse(shape, state):
            self._events.append(f"leave {state.config.label} early: predicted under {1 - EARLY_DROP:g} x the best "
                                "explored")
            force = True
        if not force and not (measured and ((fresh >= DWELL_SAMPLES and dwelt >= self.explore_dwell_s)
                                            or dwelt >= 3 * self.explore_dwell_s)):
            return
        self._next_candidate(shape, state, now)

    def _end_exploration(self, shape: tuple, state: ShapeState, now: float) -> None:
        state.phase = EXPLOIT
        state.recheck_every_s = self.recheck_after_s
        state.next_recheck_t = now + self.recheck_after_s
        if not self._choose(shape, state, now, force=True) and state.config not in self._allowed(shape, state):
            # Nothing explored could be chosen (every candidate deferred by the bound): run the
            # fastest at the lowest duty, and try again after the next budget change.
            timed = [c for c in state.candidates if c not in state.forbidden and self.model.stats.get((shape, c))]
            if timed:
                fastest = max(timed, key=lambda c: self.model.stats[(shape, c)].tokens_per_s_full or 0.0)
                state.choice = fastest
                state.run(fastest, now, self._samples(shape, fastest))
                self.loop.reset(self.loop.d_min)

    def _try(self, shape: tuple, state: ShapeState, config: Configuration, now: float) -> bool:
        """Run `config` for this shape from now if the power bound allows it; else defer it.
        Where several shapes share the GPU, one shape's configuration is a part of the
        power, and the duty is the loop's alone."""
        if self._several_shapes:
            state.run(config, now, self._samples(shape, config))
            return True
        if not self._duty_for_switch(shape, config):
            state.deferred.add(config)
            watts = predicted_power(self.model, (shape, config), self.loop.d_min, self.idle_w, self.limit_w)
            self._events.append(f"defer {config.label}: predicted {watts:.0f} W at duty {self.loop.d_min:g} "
                                f"with {max(0.0, self.offset_w):.0f} W of others, over the set point "
                                f"{self.setpoint_w:.0f} W")
            return False
        state.run(config, now, self._samples(shape, config))
        return True

    # ---- re-checks ----------------------------------------------------------------------
    def _maybe_recheck(self, shape: tuple, state: ShapeState, now: float) -> None:
        """Run the runner-up again for a dwell, if it is a plausible winner and fits the budget."""
        ranked, _ = self._ranked(shape, state)
        state.next_recheck_t = now + state.recheck_every_s
        scores = dict(ranked)
        runner = next((c for c, _ in ranked if c != state.choice), None)
        mine = scores.get(state.choice)
        if runner is None or mine is None or scores[runner] is None:
            return
        if scores[runner] < mine - (1 - self.recheck_within) * abs(mine):
            return  # not a plausible winner: the noise of a second's readings is not that large
        if not self._try(shape, state, runner, now):
            return
        state.phase = RECHECK
        self._events.append(f"recheck {runner.label} against {state.choice.label}")

    def _advance_recheck(self, shape: tuple, state: ShapeState, now: float) -> None:
        fresh = self._samples(shape, state.config, latency=state.mixed) - state.samples_at_start
        dwelt = now - state.since
        if not ((fresh >= DWELL_SAMPLES and dwelt >= self.explore_dwell_s) or dwelt >= 3 * self.explore_dwell_s):
            return
        runner, incumbent = state.config, state.choice
        scores = dict(self._ranked(shape, state)[0])
        state.phase = EXPLOIT
        gain = scores.get(runner) is not None and scores.get(incumbent) is not None \
            and self._better(scores[runner], scores[incumbent])
        if gain:
            state.choice = runner
            state.recheck_every_s = self.recheck_after_s
            self._events.append(f"recheck: switch to {runner.label}")
        else:
            state.run(incumbent, now, self._samples(shape, incumbent))
            if not self._several_shapes:
                self._duty_for_switch(shape, incumbent)
            state.recheck_every_s = min(self.recheck_max_s, 2 * state.recheck_every_s)
            self._events.append(f"recheck: keep {incumbent.label}")
        state.since = now
        state.next_recheck_t = now + state.recheck_every_s

    # ---- ranking -----------------------------------------------------------------------
    def _samples(self, shape: tuple, config: Configuration, latency: bool = False) -> int:
        """Samples so far of what a dwell waits for: power (J/token in energy mode), or GPU time."""
        stats = self.model.stats.get((shape, config))
        if stats is None:
            return 0
        if latency:
            return stats.latency_samples
        return stats.j_samples if self.mode == "energy" else stats.eta_samples

    def _too_slow(self, shape: tuple, stats) -> bool:
        """Whether a configuration's full-duty throughput is under `prune_below` (0.4) of the
        fastest one measured for this shape. To be worth choosing, such a configuration
        would have to draw well under half the watts above idle of the faster one; on the
        boards measured the slow ones (a 33-CTA cap, the memory-efficient backend, at 0.28-0.35x
        cuDNN's throughput) drew 0.68x and more (docs/control.md), so their power dwell only
        costs exploration time. A frugal configuration that is merely slower (0.6x) is
        still explored in full."""
        speeds = [st.tokens_per_s_full for (sh, _), st in list(self.model.stats.items())
                  if sh == shape and st.tokens_per_s_full is not None and st.latency_samples >= PROBE_SAMPLES]
        return (stats.tokens_per_s_full is not None and bool(speeds)
                and stats.tokens_per_s_full < self.prune_below * max(speeds))

    def _clearly_worse(self, shape: tuple, state: ShapeState) -> bool:
        """Whether the candidate exploring now is predicted well under the best one explored
        before it, at this set point (both by power seen at a comparable operating point)."""
        others = [c for c in state.candidates if c != state.config and c not in state.pruned
                  and c not in state.forbidden and self._samples(shape, c) >= DWELL_SAMPLES]
        if not others:
            return False
        mine = self._score(shape, state.config, True)
        best = max((self._score(shape, c, True) for c in others), key=lambda s: -float("inf") if s is None else s)
        if mine is None or best is None:
            return False
        return mine < best - EARLY_DROP * abs(best)

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

    def _better(self, score: float | None, than: float) -> bool:
        """A predicted gain over `hysteresis` (scores are throughput, or minus J/token)."""
        return score is not None and score - than > self.hysteresis * abs(than)

    def _allowed(self, shape: tuple, state: ShapeState) -> list[Configuration]:
        allowed = [c for c in state.candidates if c not in state.forbidden and c not in state.pruned
                   and c not in state.deferred and self.model.stats.get((shape, c)) is not None
                   and self.model.stats[(shape, c)].tokens_per_s_full is not None]
        if self.mode == "energy" and self.max_slowdown is not None and allowed:
            fastest = max(self.model.stats[(shape, c)].tokens_per_s_full for c in allowed)
            allowed = [c for c in allowed
                       if self.model.stats[(shape, c)].tokens_per_s_full >= (1 - self.max_slowdown) * fastest]
        return allowed

    def _ranked(self, shape: tuple, state: ShapeState) -> tuple[list[tuple[Configuration, float | None]], bool]:
        """Allowed configurations by score, best first, and whether the score is by power."""
        allowed = self._allowed(shape, state)
        # Power is attributable only where a tick ran this shape alone; rank every candidate
        # by the same yardstick, so use it only if all of them have it.
        use_eta = bool(allowed) and all(self._samples(shape, c) > 0 for c in allowed)
        scores = {c: self._score(shape, c, use_eta) for c in allowed}
        ranked = sorted(allowed, key=lambda c: -float("inf") if scores[c] is None else scores[c], reverse=True)
        return [(c, scores[c]) for c in ranked], use_eta

    def _choose(self, shape: tuple, state: ShapeState, now: float, force: bool = False,
                skip_dwell: bool = False) -> bool:
        """Make the best allowed configuration the shape's choice; whether it changed."""
        ranked, use_eta = self._ranked(shape, state)
        if not ranked:
            return False
        scores = dict(ranked)
        best = ranked[0][0]
        if best == state.choice:
            if state.config == best:
                return False
        elif not force:
            if now - state.since < self.dwell_s and not skip_dwell:
                return False
            if self.mode == "budget" and self.offset_w > OTHERS_HOLD_CHOICE * self.setpoint_w:
                # Another tenant takes much of the budget: what is left is read from the low-duty
                # ends of the tables, the least measured; the choice made without it stands.
                return False
            current = scores.get(state.choice)
            if current is not None and not self._better(scores[best], current):
                return False
        state.choice = best
        state.run(best, now, self._samples(shape, best))
        if not self._several_shapes:
            self._duty_for_switch(shape, best)
        unit = "J/token" if self.mode == "energy" and use_eta else "tokens/s"
        self._events.append(f"choose {best.label} (" + ", ".join(
            f"{c.label} {abs(s):.4g}" for c, s in ranked[:3] if s is not None) + f" {unit})")
        return True

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
            if self.power_filtered is not None:  # the readings' noise, as a mean absolute deviation
                # (clipped: a step of the load is not noise)
                self._noise_w += 0.05 * (min(abs(power - self.power_filtered), NOISE_CLIP_W) - self._noise_w)
            self.power_filtered = power if self.power_filtered is None else 0.3 * self.power_filtered + 0.7 * power
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
                self._decide(now)
                phase = self._phase()
                if self.mode == "budget" and self.power_filtered is not None and power is not None:
                    table = self._running_table()  # what runs from now, not what ran before
                    # The feed-forward reads the table of our own watts at the set point less the
                    # watts of others (offset_w); the integral carries only what both got wrong.
                    # A tick without a reading leaves the duty alone: no integration of an old error.
                    ff = self._feed_forward(table)
                    self.loop.update(self._aim_w(), self.power_filtered, dt, ff)
                    if self._tenant_step and ff is not None:
                        self.loop.reset(ff)  # the others' watts are in the feed-forward now
                        self.loop.hold(1)
                        self._events.append(f"others' watts now {self.offset_w:.0f} W")
                    self._cut_overshoot(power, table)
                self._tenant_step = False
        dominant = self._dominant(work)
        row = {
            "t": now, "mode": self.mode, "phase": phase, "budget_w": self.budget_w, "setpoint_w": self.setpoint_w,
            "margin": self.margin, "power_w": power, "power_filtered_w": self.power_filtered,
            "energy_mj": reading.energy_mj, "temp_c": reading.temp_c, "sm_clock_mhz": reading.sm_clock_mhz,
            "clock_reasons": reading.clock_reasons, "duty": self.loop.duty, "offset_w": self.offset_w,
            "config": dominant.label if dominant else None, "choice": self._choice_label(),
            "configs": len(work.by_key),
            "calls": sum(c for c, _ in work.by_key.values()), "tokens": work.tokens, "tokens_per_s": tokens_per_s,
            "telemetry_ok": not stale, "telemetry_error": reading.error, "event": "; ".join(self._events) or None,
        }
        self._events = []
        return row

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
        if same:
            table = self.model.power.get(single)
        elif len(shapes) > 1:
            table = self.model.mix_power
        else:
            return
        # While the duty moves, the reading lags it: only a step too large for that (a tenant
        # that left while the loop climbed) is taken, and nothing is learned.
        if not self._track_others(power, table, steps_only=not steady_duty) or not steady_duty:
            return
        if self._others_present():
            return
        if single is None:
            table.add(self.loop.duty, power - self.offset_w)
            return
        near_setpoint = self.setpoint_w is not None and abs(power - self.setpoint_w) <= 0.1 * self.setpoint_w
        self.model.add_tick(*single, tokens_per_s, power - self.offset_w, self.idle_w, self.loop.duty,
                            comparable=near_setpoint or self.loop.duty >= 0.98)

    def _track_others(self, power: float, table, steps_only: bool = False) -> bool:
        """Update the estimate of watts on the board that our table does not explain (another
        tenant, warming up): an offset common to every configuration, so that a disturbance
        is neither learned as one configuration's cost nor makes another look cheaper.
        Whether the tick may be learned from: only once the offset has settled (while it is
        still catching up with a tenant that came or went, power less the offset is not
        ours, and would be written into our table, and a warm start would keep it)."""
        expected = table.power_at(self.loop.duty, self.idle_w) if table is not None else None
        if expected is None:
            return True
        if self._quiet_since is not None and self.clock() - self._quiet_since < TABLE_FIRST_S:
            # Just after a switch (or a warm start), a difference is first the table's error
            # (a warm start's older table, a configuration's table read at a new duty): the
            # table learns it, the others' watts stay as they were.
            return True
        innovation = (power - expected) - self.offset_w
        # (while the duty moves the reading lags it; a mix of shapes, which takes no step
        # whole, follows the others' watts anyway, smoothed)
        moved = 0.0 if steps_only and not self._several_shapes else 0.3 * innovation
        # (a mix of shapes changes its watts whenever one shape changes its configuration:
        # only a step three times as large is surely another tenant's there)
        threshold = max(TENANT_STEP_W, 4.0 * self._noise_w) * (2.0 if steps_only else 1.0) * (
            3.0 if self._several_shapes else 1.0)
        if abs(innovation) > threshold and not self._just_changed():
            # A step in watts we did not make: a tenant came or went. Take it whole now, and
            # move the duty to meet the set point with it, instead of over several ticks.
            moved = innovation
            self._tenant_step = True
        self.offset_w += moved
        settled = abs(moved) <= max(OFFSET_SETTLED_W, 2.0 * self._noise_w)
        if not settled:
            self._offset_moved_t = self.clock()
        return settled

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

    def _adapt_margin(self, now: float, energy_mj: float | None) -> None:
        """Widen the set point's margin under the budget while the 1 s averages of power (the
        quantity a budget is judged by, from the energy counter) spread: with a bursty
        tenant on the board the loop cannot cancel every burst, and a set point 1.645
        standard deviations under the budget keeps about 95% of windows within it.
        Windows that hold a budget step or a switch of ours are left out."""
        if energy_mj is None or self.mode != "budget" or self.budget_w is None:
            return
        self._energy.append((now, energy_mj / 1e3, self.setpoint_w, self.budget_w))
        self._update_debt(now)
        older = [(t, j) for t, j, _, _ in self._energy if t <= now - 1.0]
        if not older:
            return
        t0, j0 = older[-1]
        quiet = self._quiet_since is None or t0 >= self._quiet_since
        if quiet and now > t0:
            # the window's power about the set point it was aiming at (a ramp moves both)
            aimed = statistics.fmean(sp for t, _, sp, _ in self._energy if t > t0)
            self._window_w.append((energy_mj / 1e3 - j0) / (now - t0) - aimed)
        if len(self._window_w) >= 10:
            spread = statistics.pstdev(self._window_w)
            self.margin = min(self.max_margin, max(self.base_margin, 1.645 * spread / self.budget_w))

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

    def _settled(self, now: float) -> bool:
        """Power within 5% of the set point for the last second, and the unexplained watts on
        the board steady for as long (while another tenant comes or goes, the model's
        attribution is uncertain; a steady offset is taken out of every prediction alike);
        energy mode: always."""
        if self.mode != "budget":
            return True
        if now - self._offset_moved_t < 1.0:  # the others' watts moved: attribution is uncertain
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

    def _resume(self, now: float) -> None:
        """Readings are back: each shape returns to its choice from before the fallback, at
        the duty its table gives (bounded), and the loop takes over."""
        self._events.append("telemetry back: control resumed")
        self.fallback_reason = None
        self.loop.reset()
        for shape, state in list(self.shapes.items()):
            if state.before_fallback is not None and state.before_fallback not in state.forbidden:
                state.choice = state.before_fallback
                state.run(state.choice, now, self._samples(shape, state.choice))
                if not self._several_shapes:
                    self._duty_for_switch(shape, state.choice)
            state.before_fallback = None

    def _enter_fallback(self) -> None:
        """The most frugal operating point known: lowest power seen, else the lowest duty; and
        never above the duty at which the power prior, with the others' watts last seen, is
        within the set point (the lowest power seen may be over the budget now)."""
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

    # ---- knowledge -----------------------------------------------------------------------
    def learned(self) -> dict[tuple, dict]:
        """What each shape that finished exploring learned, for a warm start
        (flashwatt.control.warm_start): its configurations' statistics, their duty -> power
        tables, and the refusals that do not depend on the inputs."""
        out = {}
        for shape, state in list(self.shapes.items()):
            if state.exploring or self.mode == "static":
                continue
            stats = {c.label: self.model.stats[(shape, c)] for c in state.candidates
                     if (shape, c) in self.model.stats and self.model.stats[(shape, c)].tokens_per_s_full is not None}
            power = {c.label: self.model.power[(shape, c)] for c in state.candidates if (shape, c) in self.model.power}
            refused = {c.label: why.removeprefix(EARLIER_REFUSAL) for c, why in state.forbidden.items()
                       if not why.startswith(PRECISION_REFUSAL)}
            if state.mixed and self.model.mix_power.bins:
                power[MIX_TABLE] = self.model.mix_power
            if stats:
                out[shape] = {"stats": stats, "power": power, "refused": refused, "mixed": state.mixed}
        return out
