"""The public face of the power-aware scheduler: `Controller.attention(q, k, v)`.

    ctl = Controller(mode="budget", budget_w=450, device=0)
    out = ctl.attention(q, k, v, causal=True)   # same contract as the registry's kernels
    ctl.set_budget(550)
    ctl.trace()                                  # one row per decision tick

Each call runs the configuration the governor picks for its shape, through the kernel
registry. Around the calls the controller does three things on the host, none of which
touches a device setting:
- keeps at most `max_in_flight_s` of GPU work queued (a CUDA event per ~1 ms of work), so
  a new duty or configuration acts within milliseconds, not after a long backlog drains;
- paces: after enough GPU work to owe `pace_quantum_s` of idle time at the current duty,
  waits for the queue to drain and sleeps that long, so the GPU really idles;
- times a sample of calls with CUDA events (the first three calls of each configuration
  synchronously, the first of them dropped, then one every `latency_every_s`), which feeds
  the online model.
A sensor thread reads NVML about ten times a second and lets the governor decide.

Warm start: what the controller learns is kept (flashwatt.control.warm_start) under
`cache` (default: $FLASHWATT_CONTROL_CACHE, else results/control-cache; None or
FLASHWATT_CONTROL_CACHE=off switches it off), keyed by the GPU, its driver and the build;
a later run starts each shape it knows at its operating point. `warm_start()` says what a
run started from.

Precision, only with `precision_tolerance`: a cheaper precision is used for a shape only
after a check against float64 on that call's own inputs stays within the tolerance; the
check repeats every `recheck_every` calls, and every verdict is in the trace. fp8 (16-bit
inputs quantised in the call) is a candidate only where the tolerance is at least fp8's
bound (flashwatt.control.configuration.step_allowed).
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any

import torch

from flashwatt.attention.cell import Cell
from flashwatt.control.configuration import Configuration, ControlError, candidates, check_knobs, step_allowed
from flashwatt.control.governor import Governor, Reading, Work
from flashwatt.control.sensor import DEFAULT_PERIOD_S, SensorThread, idle_power
from flashwatt.kernels import get_kernel
from flashwatt.kernels.base import UnsupportedCell
from flashwatt.measure import DTYPES, check_rows, reference_attention, relative_error
from flashwatt.vocabulary import STORED_AS, TOLERANCE

_PRECISION_OF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# Query rows of batch 0, head 0 compared with float64 by a precision check.
CHECK_ROWS = 256


class Controller:
    def __init__(self, mode: str = "budget", budget_w: float | None = None, device: int | str | torch.device = 0, *,
                 max_slowdown: float | None = None, configuration: Configuration | str | None = None,
                 duty: float = 1.0, knobs: dict | None = None, precision_tolerance: float | None = None,
                 telemetry: Any = None, idle_w: float | None = None, period_s: float = DEFAULT_PERIOD_S,
                 max_in_flight_s: float = 0.02, pace_quantum_s: float = 0.002, latency_every_s: float = 0.02,
                 recheck_every: int = 500, cache: Any = "default", **governor_options: Any):
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        self.knobs = check_knobs(knobs)
        if precision_tolerance is None and "precision" in self.knobs:
            raise ControlError("knob precision needs precision_tolerance: a cheaper precision is taken only "
                               "when a sampled check against float64 stays within a tolerance you give")
        if precision_tolerance is not None and not precision_tolerance > 0:
            raise ControlError(f"precision_tolerance={precision_tolerance!r}: give a positive relative error")
        if not 0 < duty <= 1:
            raise ControlError(f"duty={duty!r}: give a fraction in (0, 1]")
        self.mode = mode
        self.precision_tolerance = precision_tolerance
        self.max_in_flight_s = max_in_flight_s
        self.pace_quantum_s = pace_quantum_s
        self.latency_every_s = latency_every_s
        self.recheck_every = recheck_every

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

        if mode == "static":
            fixed = _static_configuration(configuration, precision_tolerance)
            candidates_for = lambda shape: [fixed]  # noqa: E731
        else:
            candidates_for = self._candidates_for
        duty_range = tuple(self.knobs.get("duty", (0.01, 1.0)))
        self._warm = self._open_cache(cache, telemetry) if mode != "static" else None
        self.governor = Governor(mode, candidates_for, budget_w=budget_w, idle_w=idle_w, limit_w=limit,
                                 max_slowdown=max_slowdown, static_duty=duty, duty_range=duty_range,
                                 warm_start=self._warm, **governor_options)
        self._lock = threading.Lock()
        self._work = Work()
        self._pending: list[tuple] = []  # (shape, config, tokens, start event, end event)
        self._rows: list[dict] = []
        self._checks: list[dict] = []
        self._cells: dict[tuple, Cell] = {}
        self._supported: dict[tuple, str | None] = {}
        self._calls: dict[tuple, int] = collections.Counter()
        self._in_flight: collections.deque = collections.deque()  # (event, estimated GPU seconds)
        self._unmarked_s = 0.0
        self._idle_owed_s = 0.0
        self._last_latency_t = 0.0
        self.slept_s = 0.0
        self.calls = 0
        self.tokens = 0
        self._sensor = None
        # Static mode reads the sensor too when given telemetry: its trace then carries the
        # same power readings as a controlled run (the oracle's rows), though nothing acts on them.
        if telemetry is not None and telemetry.available:
            self._sensor = SensorThread(telemetry, self._on_tick, period_s).start()

    # ---- setup ---------------------------------------------------------------------------
    def _open_telemetry(self):
        from flashwatt.telemetry import NullTelemetry, open_telemetry

        if self.device.type != "cuda" or not torch.cuda.is_available():
            return NullTelemetry(f"no CUDA device ({self.device})")
        uuid = str(getattr(torch.cuda.get_device_properties(self.device), "uuid", ""))
        return open_telemetry([uuid] if uuid else None)

    def _open_cache(self, cache: Any, telemetry: Any):
        """The warm-start cache of this GPU and build, or None (switched off, or no key)."""
        from flashwatt.control.warm_start import WarmStartCache, cache_root

        root = cache_root() if cache == "default" else cache
        if root is None or self.device.type != "cuda":
            return None
        return WarmStartCache(root, warm_start_key(self.device, telemetry))

    def _candidates_for(self, shape: tuple) -> list[Configuration]:
        precision = shape[3]
        return candidates(precision, self.knobs, precision_opt_in=self.precision_tolerance is not None,
                          tolerance=self.precision_tolerance)

    # ---- the call ------------------------------------------------------------------------
    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
        precision = _PRECISION_OF.get(q.dtype)
        if precision is None:
            raise ControlError(f"inputs of dtype {q.dtype}: the controller takes float16, bfloat16 or float32")
        shape = (tuple(q.shape), tuple(k.shape), bool(causal), precision)
        tokens = q.shape[0] * q.shape[2]
        for _ in range(16):  # each refusal removes a configuration; there are fewer than 16
            config = self.governor.config_for(shape)
            refusal = self._refusal(shape, config, q)
            if refusal is None and config.precision:
                refusal = self._precision_refusal(shape, config, q, k, v, causal)
            if refusal is not None:
                self.governor.forbid(shape, config, refusal)
                continue
            try:
                out = self._timed_call(shape, config, q, k, v, causal, tokens)
            except UnsupportedCell as err:
                self.governor.forbid(shape, config, str(err))
                continue
            break
        else:
            raise ControlError(f"no configuration could run shape {shape}")
        self._after_call(shape, config, tokens)
        return out

    def _cell(self, shape: tuple, config: Configuration) -> Cell:
        key = (shape, config)
        if key not in self._cells:
            (B, H, L, D), _, causal, precision = shape
            self._cells[key] = Cell("control", config.backend, config.precision or precision, L, max(1, B // config.chunks),
                                    H, D, causal, "fwd", config.variant)
        return self._cells[key]

    def _refusal(self, shape: tuple, config: Configuration, q: torch.Tensor) -> str | None:
        key = (shape, config)
        if key not in self._supported:
            if config.chunks > 1 and shape[0][0] % config.chunks:
                self._supported[key] = f"batch {shape[0][0]} does not split into {config.chunks} chunks"
            else:
                self._supported[key] = get_kernel(config.backend).supports(self._cell(shape, config), q.device)
        return self._supported[key]

    def _run(self, shape, config: Configuration, q, k, v, causal) -> torch.Tensor:
        cell = self._cell(shape, config)
        kernel = get_kernel(config.backend)
        if config.precision and config.precision not in STORED_AS:  # fp8 quantises the inputs it is given
            dtype = DTYPES[config.precision]
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if config.chunks == 1:
            out = kernel(q, k, v, cell)
        else:
            step = q.shape[0] // config.chunks
            out = torch.cat([kernel(q[i:i + step], k[i:i + step], v[i:i + step], cell)
                             for i in range(0, q.shape[0], step)])
        return out if not config.precision else out.to(shape_dtype(shape))

    def _timed_call(self, shape, config, q, k, v, causal, tokens) -> torch.Tensor:
        key = (shape, config)
        n = self._calls[key]
        now = time.perf_counter()
        if n < 3:  # the first calls of a configuration, timed synchronously: the probe (the 1st,
            # which may carry one-off costs, is dropped)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self._run(shape, config, q, k, v, causal)
            end.record()
            end.synchronize()
            if n >= 1:
                self.governor.on_latency(shape, config, start.elapsed_time(end) / 1e3, tokens)
        elif now - self._last_latency_t >= self.latency_every_s:
            self._last_latency_t = now
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self._run(shape, config, q, k, v, causal)
            end.record()
            with self._lock:
                self._pending.append((shape, config, tokens, start, end))
        else:
            out = self._run(shape, config, q, k, v, causal)
        self._calls[key] = n + 1
        return out

    def _after_call(self, shape: tuple, config: Configuration, tokens: int) -> None:
        with self._lock:
            self._work.add(shape, config, tokens)
        self.calls += 1
        self.tokens += tokens
        stats = self.governor.model.stats.get((shape, config))
        gpu_s = stats.s_per_call if stats and stats.s_per_call else 0.0
        # Bound the queue: one marker per ~1 ms of GPU work, wait on the oldest past the bound.
        self._unmarked_s += gpu_s
        if self._unmarked_s >= 1e-3:
            marker = torch.cuda.Event()
            marker.record()
            self._in_flight.append((marker, self._unmarked_s))
            self._unmarked_s = 0.0
            queued = sum(s for _, s in self._in_flight)
            while queued > self.max_in_flight_s and len(self._in_flight) > 1:
                event, s = self._in_flight.popleft()
                event.synchronize()
                queued -= s
        # Pacing: idle time owed at this duty; paid once it is worth a sleep, with the queue drained.
        duty = self.governor.duty
        if duty < 1.0 and gpu_s:
            self._idle_owed_s += gpu_s * (1.0 - duty) / duty
            if self._idle_owed_s >= self.pace_quantum_s:
                torch.cuda.current_stream(self.device).synchronize()
                self._in_flight.clear()
                self._unmarked_s = 0.0
                t0 = time.perf_counter()
                time.sleep(self._idle_owed_s)
                slept = time.perf_counter() - t0
                self.slept_s += slept
                self._idle_owed_s -= slept

    # ---- precision -----------------------------------------------------------------------
    def _precision_refusal(self, shape, config, q, k, v, causal) -> str | None:
        key = (shape, config)
        n = self._calls[key]
        if n % self.recheck_every:
            return None
        out = self._run(shape, config, q[:1], k[:1], v[:1], causal)
        rows = check_rows(q.shape[2], CHECK_ROWS)
        with torch.no_grad():
            ref = reference_attention(q[0, :1], k[0, :1], v[0, :1], causal, rows)
            err = relative_error(out[0, :1][:, rows.to(out.device)], ref)
        ok = err <= self.precision_tolerance  # NaN never passes
        self._checks.append({"t": time.monotonic(), "config": config.label, "shape": str(shape), "call": n,
                             "rel_err": err, "tolerance": self.precision_tolerance, "passed": ok})
        if ok:
            return None
        return f"precision check failed: rel_err {err:.3g} > tolerance {self.precision_tolerance:g}"

    # ---- the loop ------------------------------------------------------------------------
    def _on_tick(self, reading: Reading) -> None:
        with self._lock:
            work, self._work = self._work, Work()
            pending, self._pending = self._pending, []
        still = []
        for shape, config, tokens, start, end in pending:
            if end.query():
                self.governor.on_latency(shape, config, start.elapsed_time(end) / 1e3, tokens)
            else:
                still.append((shape, config, tokens, start, end))
        if still:
            with self._lock:
                self._pending[:0] = still
        row = self.governor.tick(reading, work)
        self._rows.append(row)

    # ---- public --------------------------------------------------------------------------
    def set_budget(self, budget_w: float) -> None:
        self.governor.set_budget(budget_w)

    @property
    def exploring(self) -> bool:
        """Whether some shape seen so far is still trying its candidates."""
        return any(state.exploring for state in list(self.governor.shapes.values()))

    def choices(self) -> dict[str, str]:
        """Each shape's choice now (its label), by the shape's text (a re-check of the runner-up
        runs another configuration for a moment without changing the choice)."""
        return {str(shape): state.choice.label for shape, state in list(self.governor.shapes.items())}

    def warm_start(self) -> dict:
        """Where the run's knowledge came from: the cache file, and the shapes started warm."""
        shapes = list(self.governor.shapes.items())
        return {"cache": str(self._warm.path) if self._warm is not None else None,
                "warm_shapes": sum(state.warm for _, state in shapes), "shapes": len(shapes)}

    def refusals(self) -> dict[str, str]:
        """Configurations a shape may not use, and why ("<shape> <label>" -> reason)."""
        return {f"{shape} {config.label}": why for shape, state in list(self.governor.shapes.items())
                for config, why in state.forbidden.items()}

    def call_counts(self) -> dict[str, int]:
        """Calls run so far per configuration label, over every shape."""
        counts: collections.Counter = collections.Counter()
        for (_, config), n in list(self._calls.items()):
            counts[config.label] += n
        return dict(counts)

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
        if sensor is not None:
            sensor.stop()
            self._sensor = None
            if sensor.error is not None:
                raise RuntimeError(f"control loop failed: {sensor.error!r}") from sensor.error
        warm = getattr(self, "_warm", None)
        if warm is not None:
            warm.save(self.governor.learned())
            self._warm = None
        if getattr(self, "_owns_telemetry", False) and self.telemetry is not None:
            self.telemetry.close()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shape_dtype(shape: tuple) -> torch.dtype:
    return DTYPES[shape[3]]


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
