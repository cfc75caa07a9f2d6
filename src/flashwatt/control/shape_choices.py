"""How the controller chooses a configuration for each call shape: the phases of a shape
(flashwatt.control.shape_state: probe, explore, exploit, recheck), the warm start, the
ranking of configurations by predicted throughput at the set point (or joules per token in
energy mode), and what each shape learned, for the next run's warm start.

A part of flashwatt.control.governor.Governor (a mixin): it reads the governor's model,
mode, set point, others' watts and clock, and has the governor move the duty when a
configuration starts (flashwatt.control.power_holding).
"""
from __future__ import annotations

from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.control.power_bound import predicted_power
from flashwatt.control.shape_state import EXPLOIT, EXPLORE, PROBE, RECHECK, ShapeState

# Latency samples that measure a configuration's GPU time in the probe (the controller
# times a configuration's first calls synchronously and drops the very first).
PROBE_SAMPLES = 2
# Fresh power samples (ticks at a comparable operating point) that end a dwell.
DWELL_SAMPLES = 3
# A candidate predicted this much below the best one explored is left early.
EARLY_DROP = 0.15
# While the others' watts are over this share of the set point, a shape keeps its choice.
OTHERS_HOLD_CHOICE = 0.10
# Refusals a warm start carries over: those of the backend, not a precision check's (which
# depends on the inputs; flashwatt.control.controller).
PRECISION_REFUSAL = "precision check"
EARLIER_REFUSAL = "refused in an earlier run: "
# A mixed shape's warm-start entry keeps the table of the mix it ran in under this label.
MIX_TABLE = "(mix)"


class ShapeChoices:
    """The governor's choosing of configurations (module docstring)."""

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
        """Begin at the operating point a cache entry gives, if it covers every candidate; from
        an entry of a run that ended while still exploring (`partial`), go on exploring the
        candidates whose power it had not yet seen, without probing again."""
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
        state.warm = True
        if entry.get("partial") and not entry.get("mixed"):
            return self._resume_exploration(shape, state, now, entry)
        state.phase = EXPLOIT
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

    def _resume_exploration(self, shape: tuple, state: ShapeState, now: float, entry: dict) -> bool:
        """Explore, fastest first, the candidates an earlier run probed but whose power it had
        not seen at an operating point before it ended. Runs shorter than an exploration
        otherwise each began from nothing again and saved nothing: on an H200, 5 of 20
        five-second runs with budget steps and NVML gaps in a row."""
        state.phase = EXPLORE
        timed = [c for c in self._by_speed(shape, state) if c not in state.pruned]
        state.to_explore = [c for c in timed if self._samples(shape, c) < DWELL_SAMPLES]
        self._events.append(f"warm start: explore {len(state.to_explore)} of {len(timed)} configurations on, "
                            f"from {entry.get('runs', 0)} earlier run(s)")
        if self.mode == "budget" and not self._several_shapes:
            self.loop.duty = min(self.loop.duty, self._start_duty())
        self._next_candidate(shape, state, now)
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
        timed = self._by_speed(shape, state)
        for config in timed[1:]:
            stats = self.model.stats[(shape, config)]
            if self._too_slow(shape, stats):
                state.pruned.add(config)
                self._events.append(f"prune {config.label} ({stats.tokens_per_s_full:.4g} tokens/s at full duty, "
                                    f"under {self.prune_below:g} x the fastest explored)")
        state.phase = EXPLORE
        state.to_explore = [c for c in timed if c not in state.pruned]
        self._next_candidate(shape, state, now)

    def _by_speed(self, shape: tuple, state: ShapeState) -> list[Configuration]:
        """The candidates not forbidden whose GPU time is measured, fastest first."""
        timed = [c for c in state.candidates if c not in state.forbidden
                 and self.model.stats.get((shape, c)) is not None
                 and self.model.stats[(shape, c)].tokens_per_s_full is not None]
        return sorted(timed, key=lambda c: self.model.stats[(shape, c)].tokens_per_s_full, reverse=True)

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

    # ---- knowledge -----------------------------------------------------------------------
    def learned(self) -> dict[tuple, dict]:
        """What each shape that finished its probe learned, for a warm start
        (flashwatt.control.warm_start): its configurations' statistics, their duty -> power
        tables, and the refusals that do not depend on the inputs; `partial` where it was
        still exploring (the next run explores on from there)."""
        out = {}
        for shape, state in list(self.shapes.items()):
            if state.phase == PROBE or self.mode == "static":
                continue
            stats = {c.label: self.model.stats[(shape, c)] for c in state.candidates
                     if (shape, c) in self.model.stats and self.model.stats[(shape, c)].tokens_per_s_full is not None}
            power = {c.label: self.model.power[(shape, c)] for c in state.candidates if (shape, c) in self.model.power}
            refused = {c.label: why.removeprefix(EARLIER_REFUSAL) for c, why in state.forbidden.items()
                       if not why.startswith(PRECISION_REFUSAL)}
            if state.mixed and self.model.mix_power.bins:
                power[MIX_TABLE] = self.model.mix_power
            if stats:
                out[shape] = {"stats": stats, "power": power, "refused": refused, "mixed": state.mixed,
                              "partial": state.phase == EXPLORE}
        return out

