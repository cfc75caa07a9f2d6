"""The public face of the power-aware scheduler: one `Controller` for attention calls and for
whole model steps.

    ctl = Controller(mode="budget", budget_w=450, device=0)
    out = ctl.attention(q, k, v, causal=True)   # same contract as the registry's kernels

    with Controller(mode="budget", budget_w=450, temp_limit_c=83) as ctl:
        ctl.attach(model)                        # its attention backend, recompute, pacing points
        for batch in loader:
            loss = ctl.step(lambda plan: train_step(batch, plan), tokens=batch.numel())

    ctl.set_budget(550)
    ctl.trace()                                  # one row per decision tick

Both go through one loop: the governor (flashwatt.control.governor) picks a configuration
per call shape or step, learns from a sensor thread's readings about ten times a second
and sets the duty; the pacer (flashwatt.control.pacing) makes the idle time the duty owes,
on the host, between launches; what was learned is kept for the next run (warm start).
None of it touches a device setting. The attention calls are flashwatt.control.attention_calls,
the steps flashwatt.control.model_steps.

Warm start: what the controller learns is kept (flashwatt.control.warm_start) under
`cache` (default: $FLASHWATT_CONTROL_CACHE, else results/control-cache; None or
FLASHWATT_CONTROL_CACHE=off switches it off), keyed by the GPU, its driver and the build;
a later run starts each shape it knows at its operating point. `warm_start()` says what a
run started from. A job on several GPUs keeps its own: rank 0 decides for the job from the
GPUs' summed power, so its tables are the job's, kept under rank 0's GPU with the job's
size in the key, and not kept after a fault (the governor is then one GPU's).
`cache` may also be a WarmStartCache, whose key the caller chose.

fp8 (16-bit inputs quantised in the call) is a candidate only where the tolerance is at least
fp8's bound (flashwatt.control.configuration.step_allowed).

A job on several GPUs holds one budget for all of them (`group=`: the job's process group;
flashwatt.control.job_power): the ranks share their readings every tick and pace together.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

import torch

from flashwatt.control.attention_calls import AttentionCalls
from flashwatt.control.configuration import (KEEP_BACKEND, Configuration, ControlError, candidates, check_knobs,
                                             step_allowed, step_candidates)
from flashwatt.control.counter_power import CounterPower, windowed
from flashwatt.control.duty_mix import DutyMix
from flashwatt.control.governor import Governor, Reading, Work
from flashwatt.control.model_steps import ModelSteps
from flashwatt.control.pacing import CALL_CYCLE_S, DeviceOps, Pacer
from flashwatt.control.sensor import DEFAULT_PERIOD_S, SensorThread, idle_power
from flashwatt.control.step_credit import StepCredit
from flashwatt.vocabulary import TOLERANCE


class Controller(AttentionCalls, ModelSteps):
    def __init__(self, mode: str = "budget", budget_w: float | None = None, device: int | str | torch.device = 0, *,
                 max_slowdown: float | None = None, configuration: Configuration | str | None = None,
                 duty: float = 1.0, knobs: dict | None = None, precision_tolerance: float | None = None,
                 precision_probe: Callable[[], torch.Tensor] | None = None, temp_limit_c: float | None = None,
                 telemetry: Any = None, idle_w: float | None = None, period_s: float = DEFAULT_PERIOD_S,
                 max_in_flight_s: float = 0.02, pace_quantum_s: float = 0.002, pace_cycle_s: float = CALL_CYCLE_S,
                 pace_mix: tuple[float, float] | None = None, latency_every_s: float = 0.02,
                 recheck_every: int = 500, cache: Any = "default", group: Any = None, on_peer_loss: str = "end",
                 peer_timeout_s: float | None = None, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None, device_ops: DeviceOps | None = None,
                 sensor: bool = True, **governor_options: Any):
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        self.knobs = check_knobs(knobs)
        self._check_settings(self.knobs, duty, precision_tolerance)
        self.mode = mode
        self.precision_tolerance = precision_tolerance
        self.precision_probe = precision_probe
        self.latency_every_s = latency_every_s
        self.recheck_every = recheck_every
        self._clock = clock or time.perf_counter
        self._ops = device_ops or DeviceOps(self.device, self._clock)
        if pace_mix is not None and pace_cycle_s:
            # (a mix's phases are shorter than a cycle's payment: the idle would come whole periods late)
            raise ControlError(f"pace_mix={pace_mix!r} with pace_cycle_s={pace_cycle_s!r}: give one of them")
        governed = lambda: self.governor.duty  # noqa: E731
        # (time-sharing full duty with a lower one in place of one duty between them: opt-in)
        self._mix = _duty_mix(governed, pace_mix, self._clock) if pace_mix is not None else None
        self._pacer = Pacer(self._ops, self._mix or governed, pace_quantum_s, max_in_flight_s, self._clock,
                            sleep or time.sleep, target_cycle_s=pace_cycle_s)

        owns_telemetry = telemetry is None and mode != "static"
        if owns_telemetry:
            telemetry = self._open_telemetry()
        self.telemetry = telemetry
        self._owns_telemetry = owns_telemetry
        limit = None
        if telemetry is not None and telemetry.available:
            limit = (telemetry.devices[0] or {}).get("power_limit_enforced_w")
            if idle_w is None and mode != "static":
                idle_w = idle_power(telemetry, period_s=period_s)
        elif mode != "static":
            why = getattr(telemetry, "reason", None) or "no telemetry"
            self.close()
            raise ControlError(f"mode {mode!r} needs live power readings from NVML, which are not available "
                               f"({why}); mode 'static' runs without them")
        self.idle_w, self.limit_w = idle_w, limit
        self._shared = self._open_job_power(group, on_peer_loss, peer_timeout_s, period_s)
        if self._shared is not None:  # the job's GPUs as one: their idle powers and limits summed
            idle_w, limit = self._shared.job_totals(idle_w, limit)
            self.idle_w, self.limit_w = idle_w, limit
            # every rank idles at the same pacing points for as long (flashwatt.control.pacing)
            self._pacer.agree = lambda owed_s: self._shared.agree_idle(owed_s, self)

        if mode == "static":
            fixed = _static_configuration(configuration, precision_tolerance)
            candidates_for = lambda shape: [fixed]  # noqa: E731
        else:
            candidates_for = self._candidates_for
        duty_range = tuple(self.knobs.get("duty", (0.01, 1.0)))
        # (on several ranks only rank 0's governor decides, for the job: its tables are the job's)
        deciding = self._shared is None or self._shared.rank == 0
        self._warm = self._open_cache(cache, telemetry) if mode != "static" and deciding else None
        self.governor = Governor(mode, candidates_for, budget_w=budget_w, idle_w=idle_w, limit_w=limit,
                                 max_slowdown=max_slowdown, static_duty=duty, duty_range=duty_range,
                                 warm_start=self._warm, temp_limit_c=temp_limit_c,
                                 clock=clock or time.monotonic, **governor_options)
        self._lock = threading.Lock()
        self._work = Work()
        self._credit = StepCredit()
        self._counter = CounterPower()
        self.period_s = period_s
        self._pending: list[tuple] = []  # (shape, config, tokens, start stamp, end stamp, seconds slept between)
        self._rows: list[dict] = []
        self._checks: list[dict] = []
        self._cells: dict[tuple, Any] = {}
        self._supported: dict[tuple, str | None] = {}
        self._calls: dict[tuple, int] = collections.Counter()
        self._last_latency_t = 0.0
        self.calls = 0
        self.tokens = 0
        self._init_steps()
        self._sensor = None
        # Static mode reads the sensor too when given telemetry: its trace then carries the
        # same power readings as a controlled run (the oracle's rows), though nothing acts on them.
        if sensor and telemetry is not None and telemetry.available:
            self._sensor = SensorThread(telemetry, self.tick, period_s).start()

    # ---- setup ---------------------------------------------------------------------------
    @staticmethod
    def _check_settings(knobs: dict, duty: float, precision_tolerance: float | None) -> None:
        if precision_tolerance is None and "precision" in knobs:
            raise ControlError("knob precision needs precision_tolerance: a cheaper precision is taken only "
                               "when a sampled check against float64 stays within a tolerance you give")
        if precision_tolerance is not None and not precision_tolerance > 0:
            raise ControlError(f"precision_tolerance={precision_tolerance!r}: give a positive relative error")
        if not 0 < duty <= 1:
            raise ControlError(f"duty={duty!r}: give a fraction in (0, 1]")

    def _open_telemetry(self):
        from flashwatt.telemetry import NullTelemetry, open_telemetry

        if self.device.type != "cuda" or not torch.cuda.is_available():
            return NullTelemetry(f"no CUDA device ({self.device})")
        uuid = str(getattr(torch.cuda.get_device_properties(self.device), "uuid", ""))
        return open_telemetry([uuid] if uuid else None)

    def _open_cache(self, cache: Any, telemetry: Any):
        """The warm-start cache of this GPU and build, or None (switched off, or no key)."""
        from flashwatt.control.warm_start import WarmStartCache, cache_root

        if isinstance(cache, WarmStartCache):
            return cache
        root = cache_root() if cache == "default" else cache
        if root is None or self.device.type != "cuda":
            return None
        key = warm_start_key(self.device, telemetry)
        if self._pacer.target_cycle_s:  # a duty draws other watts at another pacing cycle
            key["pace_cycle_s"] = self._pacer.target_cycle_s
        if self._mix is not None:  # and time-shared with another
            key["pace_mix"] = [self._mix.low, self._mix.period_s]
        if self._shared is not None:
            key["job_ranks"] = self._shared.world  # the job's summed power: a table per job size
        return WarmStartCache(root, key)

    def _open_job_power(self, group: Any, on_peer_loss: str, timeout_s: float | None, period_s: float):
        """The job's shared budget over `group` (flashwatt.control.job_power), or None on one GPU."""
        if group is None:
            return None
        from flashwatt.control.job_power import JobPower

        return JobPower(group, on_peer_loss=on_peer_loss, timeout_s=timeout_s, period_s=period_s)

    def _candidates_for(self, shape: tuple) -> list[Configuration]:
        opt_in = self.precision_tolerance is not None
        if shape[0] == "step" and (self._shared is not None or shape[-1] == "pacing only"):
            # Ranks that share a budget pace together and change nothing else: a backend or a
            # micro-batch split switched on one rank a step before another would desynchronise them.
            # A step run pacing only keeps whatever the model runs.
            return [Configuration(KEEP_BACKEND)]
        if shape[0] == "step":
            return step_candidates(shape[3], self.knobs, precision_opt_in=opt_in,
                                   backends=self._knobs.backends() if self._knobs is not None else None)
        return candidates(shape[3], self.knobs, precision_opt_in=opt_in, tolerance=self.precision_tolerance)

    # ---- the loop ------------------------------------------------------------------------
    def tick(self, reading: Reading) -> None:
        """One sensor reading: the work since the last one, the latency samples that are in,
        and the governor's decision. The sensor thread calls it about ten times a second;
        a caller that reads the sensor itself (the simulated GPU of the tests) calls it."""
        if self._shared is not None:
            reading = self._shared.exchange(reading, self)
            if reading is None:  # a rank that follows: rank 0 decided, and its duty is applied
                with self._lock:
                    self._credit.take(self._clock(), self._work)
                    self._work, self._pending = Work(), []
                return
        reading = self._step_reading(reading)
        with self._lock:
            self._credit.take(self._clock(), self._work)
            work, self._work = self._work, Work()
            pending, self._pending = self._pending, []
        still = []
        for shape, config, tokens, start, end, slept in pending:
            if self._ops.done(end):
                self.governor.on_latency(shape, config, max(0.0, self._ops.seconds(start, end) - slept), tokens)
            else:
                still.append((shape, config, tokens, start, end, slept))
        if still:
            with self._lock:
                self._pending[:0] = still
        row = self.governor.tick(reading, work)
        # (how the pacer idles: the seconds between two of its payments and between two steps'
        # starts, averaged, and the pacing points reached; a step paced only between steps
        # shows a cycle as long as its step, one paced at its blocks a cycle of milliseconds)
        row.update(pace_cycle_s=self._pacer.cycle_s or None, step_s=self._pacer.step_s or None,
                   pace_points=self._pacer.points)
        if self._shared is not None:
            row.update(self._shared.row())
            self._shared.decided(self)
        self._rows.append(row)

    def _step_reading(self, reading: Reading) -> Reading:
        """While a pacing cycle (a step's, or attention calls') is longer than a tick, the power
        over the last cycles from the energy counter in place of the instant reading, with the
        duty realized over the same window (flashwatt.control.counter_power): the governor
        learns and acts on the pair, never on the window's power against the duty set now."""
        self._counter.add(reading.t, reading.energy_mj, self._pacer.idle_s(), self._pacer.waited_s_now())
        # (a step's own phases, forward, backward, optimizer, draw differently: a step longer
        # than a tick is a cycle too, however finely its pacing points idle it)
        # (a mix of two duties is a cycle of its period)
        mix_s = self._mix.period_s if self._mix is not None else 0.0
        return windowed(self._counter, reading, max(self._pacer.cycle_s, self._pacer.step_s, mix_s), self.period_s)

    # ---- public --------------------------------------------------------------------------
    def set_budget(self, budget_w: float) -> None:
        self.governor.set_budget(budget_w)

    @property
    def slept_s(self) -> float:
        """Idle time the pacing has made so far."""
        return self._pacer.slept_s

    @property
    def exploring(self) -> bool:
        """Whether some shape seen so far is still trying its candidates."""
        return any(state.exploring for state in list(self.governor.shapes.values()))

    def choices(self) -> dict[str, str]:
        """Each shape's choice now (its label), by the shape's text (a re-check of the runner-up
        runs another configuration for a moment without changing the choice)."""
        return {str(shape): state.choice.label for shape, state in list(self.governor.shapes.items())}

    def warm_start(self) -> dict:
        """Where the run's knowledge came from: the cache file, and the shapes started warm (a
        job's governor's, also once a peer that closed first left this rank one of its own)."""
        shared = getattr(self, "_shared", None)
        governor = shared.job_governor if shared is not None and shared.job_governor is not None else self.governor
        shapes = list(governor.shapes.items())
        return {"cache": str(self._warm.path) if self._warm is not None else None,
                "warm_shapes": sum(state.warm for _, state in shapes), "shapes": len(shapes)}

    def refusals(self) -> dict[str, str]:
        """Configurations a shape may not use, and why ("<shape> <label>" -> reason)."""
        return {f"{shape} {config.label}": why for shape, state in list(self.governor.shapes.items())
                for config, why in state.forbidden.items()}

    def call_counts(self) -> dict[str, int]:
        """Calls (or steps) run so far per configuration label, over every shape."""
        counts: collections.Counter = collections.Counter()
        for (_, config), n in list(self._calls.items()):
            counts[config.label] += n
        return dict(counts)

    def fault(self) -> dict | None:
        """What went wrong with the job's other ranks, and what was done (None: nothing)."""
        return self._shared.fault if self._shared is not None else None

    def trace(self):
        import pandas as pd

        return pd.DataFrame(list(self._rows))

    def checks(self):
        import pandas as pd

        return pd.DataFrame(list(self._checks))

    def model_table(self):
        """What the controller learned: one row per (shape, configuration)."""
        import pandas as pd

        rows = []
        for (shape, config), s in list(self.governor.model.stats.items()):
            rows.append({"shape": str(shape), "config": config.label, "s_per_call": s.s_per_call,
                         "tokens_per_s_full": s.tokens_per_s_full, "eta_tokens_per_j_above_idle": s.eta,
                         "j_per_token": s.j_per_token, "latency_samples": s.latency_samples,
                         "eta_samples": s.eta_samples, "j_samples": s.j_samples})
        return pd.DataFrame(rows)

    def close(self) -> None:
        sensor = getattr(self, "_sensor", None)
        shared = getattr(self, "_shared", None)
        job_learned: dict = {}
        if shared is not None:  # the other ranks stop exchanging with this one first
            shared.close(threaded=sensor is not None, ctl=self)
            # The job's tables, whichever rank closed first (closing leaves each rank a
            # governor of its own, the job's kept aside); none after a fault: the job went
            # apart mid-run, and what its governor learned since is not the job's.
            if shared.fault is None:
                job_learned = (shared.job_governor or self.governor).learned()
        if sensor is not None:
            sensor.stop()
            self._sensor = None
        self._detach_steps()
        if sensor is not None and sensor.error is not None:
            raise RuntimeError(f"control loop failed: {sensor.error!r}") from sensor.error
        warm = getattr(self, "_warm", None)
        if warm is not None:
            warm.save(self.governor.learned() if shared is None else job_learned)
            self._warm = None
        if getattr(self, "_owns_telemetry", False) and self.telemetry is not None:
            self.telemetry.close()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def warm_start_key(device: torch.device, telemetry: Any) -> dict:
    """What a warm start must match: the GPU (model and UUID), the driver and the build (our
    kernel's build key, torch, CUDA, cuDNN). A change of any gives another cache file."""
    from flashwatt.build import build_key
    from flashwatt.checkout import KernelSourcesNotFound

    props = torch.cuda.get_device_properties(device)
    identity = (telemetry.devices[0] or {}) if telemetry is not None and getattr(telemetry, "devices", None) else {}
    try:
        kernels = build_key(torch.cuda.get_device_capability(device))
    except KernelSourcesNotFound as err:
        kernels = f"no kernel sources: {err}"
    return {"gpu": props.name, "uuid": str(getattr(props, "uuid", "")) or identity.get("uuid"),
            "driver": identity.get("driver_version"), "kernels": kernels, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


def _static_configuration(configuration: Configuration | str | None, tolerance: float | None) -> Configuration:
    """Mode 'static''s one configuration. A precision step in it runs only with the user's
    tolerance, which its sampled float64 check holds it to (and fp8 only where that tolerance
    reaches fp8's bound: step_allowed), so a step without one is refused here, before any call."""
    if configuration is None:
        raise ControlError("mode 'static' needs configuration (e.g. 'sdpa_cudnn' or 'custom[ctas66]')")
    fixed = Configuration.parse(configuration) if isinstance(configuration, str) else configuration
    if fixed.precision and tolerance is None:
        raise ControlError(f"configuration {fixed.label!r} runs {fixed.precision}, which needs precision_tolerance: "
                           f"the relative error against float64 that its sampled check must stay within")
    if fixed.precision and not step_allowed(fixed.precision, tolerance):
        raise ControlError(f"configuration {fixed.label!r}: {fixed.precision} needs precision_tolerance >= "
                           f"{TOLERANCE[fixed.precision]['fwd']:g} (its error bound), got {tolerance:g}")
    return fixed


def _duty_mix(duty: Callable[[], float], pace_mix, clock: Callable[[], float]) -> DutyMix:
    """The mix `pace_mix` asks for, (lower duty, period in seconds); its error named."""
    try:
        low, period_s = (float(v) for v in pace_mix)
    except (TypeError, ValueError):
        raise ControlError(f"pace_mix={pace_mix!r}: give (lower duty, period in seconds), e.g. (0.3, 0.25)") from None
    try:
        return DutyMix(duty, low, period_s, clock)
    except ValueError as e:
        raise ControlError(f"pace_mix={pace_mix!r}: {e}") from None
