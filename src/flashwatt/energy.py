"""Energy per call from the NVML energy counter, over a window of back-to-back calls.

A kernel that runs 0.1-5 ms cannot be measured by reading power during one call:
NVML updates power and the energy counter only every ~100 ms. So (docs/measurement.md):

1. idle power first: sync, let the GPU settle, then the counter delta over an idle
   window of about a second, idle W = dE/dt;
2. the window: sync, read counter and clock, call back-to-back until at least
   `min_window_s` has passed, sync, read counter and clock; energy per call =
   counter delta / calls;
3. a `Sampler` records instant power (field 186) throughout, for the peak, for a
   power trace, and as a cross-check: the trapezoid integral of instant power over
   the window must agree with the counter within 5 % or the window is flagged.

Edge alignment (on by default): the counter is up to ~100 ms stale when read, and at
the end of the window that staleness drops up to 100 ms of *full-load* energy (3 % of
a 3 s window at the power cap). So each edge is placed on a counter update instead:
at the start (GPU idle) we spin until the counter moves, then launch immediately; at
the end we keep calling in short synchronized batches (~2 ms) until the counter
moves, and take the calls up to that moment (interpolated within the batch). The
window is then bounded by two counter updates, and the edge error is about a batch,
not an update period.

The module is torch-free: the caller hands in `call` and `sync` (e.g.
`torch.cuda.synchronize`), so the arithmetic is unit-tested with a fake NVML.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from flashwatt.telemetry import (
    HW_SLOWDOWN_REASONS,
    POWER_REASONS,
    THERMAL_REASONS,
    Sampler,
    Telemetry,
    decode_clock_reasons,
)

COUNTER_VS_INTEGRAL_LIMIT_PCT = 5.0
MIN_TRUSTED_WINDOW_S = 1.0  # ~10 NVML updates
TAIL_BATCH_S = 0.002  # length of one synchronized batch while waiting for the end edge
MAX_CHECK_BATCH = 64  # steps between two clock checks, at most


@dataclass(frozen=True)
class EnergyWindow:
    """Result of one `measure_energy` window. Energy in J, power in W, time in s.

    Totals cover every GPU the job owns (energy summed across GPUs); `per_gpu` holds
    the same quantities for each GPU. Fields are None where they could not be
    measured; `flags` says why a value deserves suspicion.
    """

    available: bool
    reason: str | None = None
    n_gpus: int = 0
    # The energy window: from the counter update that opened it to the one that closed it
    # (per GPU, averaged over GPUs), and the calls inside; energy_j / calls is per call.
    window_s: float | None = None
    calls: float | None = None
    # The back-to-back loop between the two synchronisations (before edge alignment).
    sync_window_s: float | None = None
    sync_calls: int | None = None
    time_per_call_s: float | None = None
    calls_per_step: int = 1
    # NVML utilisation (% of the sample period a kernel ran / memory was read or written),
    # averaged over the samples inside the window, and over GPUs.
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    energy_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    idle_power_w: float | None = None
    energy_per_call_j: float | None = None
    dynamic_energy_per_call_j: float | None = None
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    clock_reasons: tuple[str, ...] = ()
    clock_reasons_s: dict[str, float] = field(default_factory=dict)
    violation_s: dict[str, float | None] = field(default_factory=dict)
    integral_j: float | None = None
    counter_vs_integral_pct: float | None = None
    flags: tuple[str, ...] = ()
    mig: bool = False
    edges_aligned: bool = False
    per_gpu: tuple[dict, ...] = ()
    trace: tuple[dict, ...] = ()

    def as_dict(self, include_trace: bool = False) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "trace"}
        out["clock_reasons"] = list(self.clock_reasons)
        out["flags"] = list(self.flags)
        out["per_gpu"] = [dict(g) for g in self.per_gpu]
        if include_trace:
            out["trace"] = [dict(r) for r in self.trace]
        return out

    def trace_frame(self):
        """The sampler trace as a pandas DataFrame (for Parquet); `in_window` marks the window."""
        import pandas as pd

        return pd.DataFrame(list(self.trace))


def gflops_per_watt(flops_per_call: float | None, energy_per_call_j: float | None) -> float | None:
    """GFLOP per joule, which is the same number as GFLOP/s per W."""
    if flops_per_call is None or energy_per_call_j is None or energy_per_call_j <= 0:
        return None
    return flops_per_call / energy_per_call_j / 1e9


# ---- helpers --------------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeReading:
    """One GPU's energy counter at a window edge: when, the value (mJ), how many calls had
    run by then (end edge only), and whether the reading sits on a counter update."""

    t: float
    counter_mj: int | None
    ticked: bool
    calls: float = 0.0


def await_ticks(telemetry: Telemetry, clock: Callable[[], float], timeout_s: float) -> list[EdgeReading]:
    """Spin until each GPU's energy counter moves from its value now.

    A GPU whose counter did not move before the timeout gets the last reading and
    ticked=False.
    """
    base = list(telemetry.energy_mj())
    found: list[EdgeReading | None] = [None] * len(base)
    t_before = clock()
    deadline = t_before + timeout_s
    while True:
        counters = telemetry.energy_mj()
        now = clock()
        pending = False
        for gpu, (old, new) in enumerate(zip(base, counters)):
            if found[gpu] is not None or old is None:
                continue
            if new is not None and new != old:
                # the update happened between the previous read and this one
                found[gpu] = EdgeReading((t_before + now) / 2, new, True)
            else:
                pending = True
        t_before = now
        if not pending or now >= deadline:
            break
    return [hit if hit is not None else EdgeReading(now, counters[gpu], False) for gpu, hit in enumerate(found)]


def _read_edge(telemetry: Telemetry, clock: Callable[[], float]) -> list[EdgeReading]:
    counters = telemetry.energy_mj()
    now = clock()
    return [EdgeReading(now, value, False) for value in counters]


def _delta_j(e0: int | None, e1: int | None) -> float | None:
    """Counter delta in J; None when missing, or when the counter went backwards (a
    wrap-around or a reset: the value cannot be trusted)."""
    if e0 is None or e1 is None or e1 < e0:
        return None
    return (e1 - e0) / 1000.0


def integrate_power(ts: Sequence[float], ps: Sequence[float], a: float, b: float) -> float | None:
    """Trapezoid integral (J) of power samples over [a, b], linear between samples,
    clipped at the edges (interpolated there, held constant beyond the first/last,
    which is what np.interp does)."""
    if len(ts) == 0 or b <= a:
        return None
    times = np.asarray(ts, dtype=float)
    inside = times[(times > a) & (times < b)]
    xs = np.concatenate(([a], inside, [b]))
    return float(np.trapezoid(np.interp(xs, times, np.asarray(ps, dtype=float)), xs))


def _pct(counter: float | None, integral: float | None) -> float | None:
    if counter is None or integral is None or counter <= 0:
        return None
    return 100.0 * (integral - counter) / counter


def _sum(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return float(sum(values))


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _max(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _nearest_before(rows: list[dict], t: float, key: str):
    best = None
    for r in rows:
        if r.get(key) is None:
            continue
        if r["t"] <= t or best is None:
            best = r[key]
        else:
            break
    return best


def _first_after(rows: list[dict], t: float, key: str):
    last = None
    for r in rows:
        if r.get(key) is None:
            continue
        last = r[key]
        if r["t"] >= t:
            return r[key]
    return last


# ---- phases ---------------------------------------------------------------------------
@dataclass(frozen=True)
class IdlePhase:
    watts: list[float | None]  # per GPU
    span: tuple[float | None, float | None]  # (start, end) for the trace's phase labels
    aligned: bool
    counter_went_back: bool


def _measure_idle(telemetry, read_edge, sync, sleep, n_gpus: int, settle_s: float, window_s: float) -> IdlePhase:
    """Idle power per GPU: the counter delta over `window_s` after `settle_s` of quiet."""
    sync()
    if window_s <= 0:
        return IdlePhase([None] * n_gpus, (None, None), True, False)
    if settle_s > 0:
        sleep(settle_s)
    opening = read_edge()
    sleep(window_s)
    closing = read_edge()
    watts: list[float | None] = []
    went_back = False
    for a, b in zip(opening, closing):
        delta = _delta_j(a.counter_mj, b.counter_mj)
        seconds = b.t - a.t
        watts.append(delta / seconds if delta is not None and seconds > 0 else None)
        went_back |= a.counter_mj is not None and b.counter_mj is not None and b.counter_mj < a.counter_mj
    span = (min(r.t for r in opening), max(r.t for r in closing))
    return IdlePhase(watts, span, all(r.ticked for r in opening + closing), went_back)


@dataclass(frozen=True)
class LoopPhase:
    opening: list[EdgeReading]  # per GPU: the counter update that opened the window
    t_first_call: float
    steps: int  # steps run between the first call and the closing sync
    t_sync: float
    counters_at_sync: list[int | None]


def _run_loop(step, sync, telemetry, read_edge, clock, min_window_s: float, max_steps: int | None) -> LoopPhase:
    """Steps back-to-back from a counter update until `min_window_s` has passed, then sync."""
    sync()
    opening = read_edge()
    t_first_call = clock()
    steps = 0
    batch = 1
    t_last_check = t_first_call
    while True:
        todo = batch if max_steps is None else min(batch, max_steps - steps)
        for _ in range(todo):
            step()
        steps += todo
        now = clock()
        if now - t_first_call >= min_window_s or (max_steps is not None and steps >= max_steps):
            break
        # A clock read costs ~0.1 us against ~5 us to launch a kernel: checking every
        # 64 steps is free. Beyond that, growing only overshoots the window, because
        # before the launch queue fills, steps return long before the GPU runs them.
        if now - t_last_check < 0.01 and batch < MAX_CHECK_BATCH:
            batch *= 2
        t_last_check = now
    sync()
    t_sync = clock()
    return LoopPhase(opening, t_first_call, steps, t_sync, telemetry.energy_mj())


def _find_end_edge(step, sync, telemetry, clock, loop: LoopPhase, timeout_s: float) -> list[EdgeReading]:
    """Keep stepping in short synchronized batches until each GPU's counter moves; the
    window ends at that update, with the steps up to it interpolated within the batch."""
    seconds_per_step = (loop.t_sync - loop.t_first_call) / loop.steps
    tail = max(1, int(TAIL_BATCH_S / seconds_per_step)) if seconds_per_step > 0 else 1
    found: list[EdgeReading | None] = [
        EdgeReading(loop.t_sync, None, False, float(loop.steps)) if value is None else None
        for value in loop.counters_at_sync
    ]
    t_before, steps_before = loop.t_sync, loop.steps
    steps = loop.steps
    deadline = loop.t_sync + timeout_s
    while any(hit is None for hit in found):
        for _ in range(tail):
            step()
        steps += tail
        sync()
        counters = telemetry.energy_mj()
        now = clock()
        for gpu, (at_sync, value) in enumerate(zip(loop.counters_at_sync, counters)):
            if found[gpu] is None and value is not None and value != at_sync:
                found[gpu] = EdgeReading((t_before + now) / 2, value, True, (steps_before + steps) / 2)
        t_before, steps_before = now, steps
        if now >= deadline:
            found = [hit or EdgeReading(now, counters[gpu], False, float(steps)) for gpu, hit in enumerate(found)]
            break
    return found  # type: ignore[return-value]


def _violations(before: dict, after: dict) -> dict[str, float | None]:
    """Seconds each performance policy held clocks down between two readings."""
    out: dict[str, float | None] = {}
    for name in before:
        v0, v1 = before.get(name), after.get(name)
        out[name] = None if v0 is None or v1 is None or v1 < v0 else (v1 - v0) / 1e9
    return out


def _summarize_gpu(gpu: int, identity: dict, rows: list[dict], opening: EdgeReading, closing: EdgeReading,
                   t_first_call: float, idle_w: float | None, calls_per_step: int, sampler_period_s: float,
                   violations: dict[str, float | None]) -> dict:
    """One GPU's window: energy from its counter, the power trace's integral and peak,
    temperatures, utilisation and clock event reasons over the samples inside it."""
    energy_j = _delta_j(opening.counter_mj, closing.counter_mj)
    counter_valid = not (opening.counter_mj is not None and closing.counter_mj is not None
                         and closing.counter_mj < opening.counter_mj)
    # The counter window opened at the update `opening.t`; energy between it and the
    # first call is idle energy (microseconds on one GPU; up to ~100 ms on several).
    if energy_j is not None and idle_w is not None:
        energy_j -= idle_w * max(0.0, t_first_call - opening.t)
        window_s = closing.t - t_first_call
    else:
        window_s = closing.t - opening.t
    limit = identity.get("power_limit_max_w") or identity.get("power_limit_enforced_w")
    if energy_j is not None and limit and window_s > 0 and energy_j / window_s > 3 * limit:
        counter_valid = False  # a jump far beyond the board's limit: a wrap or a reset
    if not counter_valid:
        energy_j = None
    for row in rows:
        row["in_window"] = t_first_call <= row["t"] <= closing.t
    window_rows = [r for r in rows if r["in_window"]]
    power_rows = [r for r in rows if r.get("power_instant_w") is not None]
    samples_in_window = sum(1 for r in window_rows if r.get("power_instant_w") is not None)
    integral_j = (integrate_power([r["t"] for r in power_rows], [r["power_instant_w"] for r in power_rows],
                                  t_first_call, closing.t) if samples_in_window >= 2 else None)
    reason_samples: dict[str, int] = {}
    for row in window_rows:
        for name in decode_clock_reasons(row.get("clock_reasons")):
            reason_samples[name] = reason_samples.get(name, 0) + 1
    calls = closing.calls * calls_per_step  # the loop counted steps
    energy_per_call = energy_j / calls if energy_j is not None and calls > 0 else None
    dynamic = None
    if energy_per_call is not None and idle_w is not None:
        dynamic = (energy_j - idle_w * window_s) / calls
    return {
        "gpu": gpu,
        "uuid": identity.get("uuid"),
        "name": identity.get("name"),
        "window_s": window_s,
        "calls": calls,
        "energy_j": energy_j,
        "avg_power_w": energy_j / window_s if energy_j is not None and window_s > 0 else None,
        "peak_power_w": _max([r.get("power_instant_w") for r in window_rows]),
        "idle_power_w": idle_w,
        "energy_per_call_j": energy_per_call,
        "dynamic_energy_per_call_j": dynamic,
        "temp_start_c": _nearest_before(rows, t_first_call, "gpu_temp_c"),
        "temp_end_c": _first_after(rows, closing.t, "gpu_temp_c"),
        "mem_temp_start_c": _nearest_before(rows, t_first_call, "mem_temp_c"),
        "mem_temp_end_c": _first_after(rows, closing.t, "mem_temp_c"),
        "samples_in_window": samples_in_window,
        "gpu_util_pct": _mean([r.get("gpu_util_pct") for r in window_rows]),
        "mem_util_pct": _mean([r.get("mem_util_pct") for r in window_rows]),
        "integral_j": integral_j,
        "counter_vs_integral_pct": _pct(energy_j, integral_j),
        "clock_reasons": sorted(reason_samples),
        "clock_reasons_s": {k: v * sampler_period_s for k, v in sorted(reason_samples.items())},
        "violation_s": violations,
        "counter_valid": counter_valid,
        "instant_power_fallback": any(r.get("power_instant_fallback") for r in power_rows),
        "mig_enabled": bool(identity.get("mig_enabled")),
    }


def _window_flags(per_gpu: list[dict], loop_s: float) -> tuple[list[str], dict[str, float], dict[str, float | None]]:
    """Flags of the whole window, with the clock reasons and violation times across GPUs (max)."""
    flags: list[str] = []
    if any(not g["counter_valid"] for g in per_gpu):
        flags.append("counter_invalid")
    if any(g["instant_power_fallback"] for g in per_gpu):
        flags.append("instant_power_fallback")
    energy_j = _sum([g["energy_j"] for g in per_gpu])
    integral_j = _sum([g["integral_j"] for g in per_gpu])
    if integral_j is None:
        flags.append("too_few_samples")
    pct = _pct(energy_j, integral_j)
    if pct is not None and abs(pct) > COUNTER_VS_INTEGRAL_LIMIT_PCT:
        flags.append("counter_vs_integral>5%")
    if loop_s < MIN_TRUSTED_WINDOW_S:
        flags.append("window_too_short")
    if any(g["mig_enabled"] for g in per_gpu):
        flags.append("mig_whole_gpu")
    reasons_s: dict[str, float] = {}
    violations: dict[str, float | None] = {}
    for g in per_gpu:
        for name, seconds in g["clock_reasons_s"].items():
            reasons_s[name] = max(reasons_s.get(name, 0.0), seconds)
        for name, seconds in g["violation_s"].items():
            if seconds is None:
                violations.setdefault(name, None)
            else:
                prev = violations.get(name)
                violations[name] = seconds if prev is None else max(prev, seconds)
    if reasons_s.keys() & THERMAL_REASONS or (violations.get("thermal") or 0) > 0:
        flags.append("throttled_thermal")
    if reasons_s.keys() & POWER_REASONS or (violations.get("power") or 0) > 0:
        flags.append("power_capped")
    if reasons_s.keys() & HW_SLOWDOWN_REASONS:
        flags.append("hw_slowdown")
    return flags, dict(sorted(reasons_s.items())), violations


def _peak_of_sum(rows: list[dict], n_gpus: int) -> float | None:
    """Peak of the summed power: sampler rounds with a sample inside every GPU's window."""
    rounds: dict[int, list[float]] = {}
    for r in rows:
        if r.get("in_window") and r.get("power_instant_w") is not None:
            rounds.setdefault(r["sample"], []).append(r["power_instant_w"])
    return _max([sum(v) for v in rounds.values() if len(v) == n_gpus]) if rounds else None


def _label_phases(rows: list[dict], idle_span: tuple[float | None, float | None], t_first_call: float) -> None:
    idle_start, idle_end = idle_span
    for r in rows:
        if r["in_window"]:
            r["phase"] = "window"
        elif idle_start is not None and idle_start <= r["t"] <= idle_end:
            r["phase"] = "idle"
        elif r["t"] < t_first_call:
            r["phase"] = "settle"
        else:
            r["phase"] = "after"


def _check_window_arguments(min_window_s: float, calls_per_step: int, max_calls: int | None) -> None:
    if min_window_s <= 0:
        raise ValueError(f"min_window_s={min_window_s}: must be positive")
    if calls_per_step < 1:
        raise ValueError(f"calls_per_step={calls_per_step}: must be at least 1")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max_calls={max_calls}: must be at least 1")


def _per_gpu_windows(rows: list[dict], identity: list[dict], idle: IdlePhase, loop: LoopPhase,
                     closing: list[EdgeReading], calls_per_step: int, sampler_period_s: float,
                     violations_before: list[dict], violations_after: list[dict]) -> list[dict]:
    """Each GPU's window (_summarize_gpu) from its own sampler rows and counter edges."""
    n_gpus = len(identity)
    rows_by_gpu: list[list[dict]] = [[] for _ in range(n_gpus)]
    for row in rows:
        rows_by_gpu[row["gpu"]].append(row)
    return [
        _summarize_gpu(gpu, identity[gpu], rows_by_gpu[gpu], loop.opening[gpu], closing[gpu], loop.t_first_call,
                       idle.watts[gpu], calls_per_step, sampler_period_s,
                       _violations(violations_before[gpu], violations_after[gpu]) if gpu < len(violations_before) else {})
        for gpu in range(n_gpus)
    ]


def _measurement_flags(idle: IdlePhase, sampler_failed: bool, align_edges: bool, aligned: bool) -> list[str]:
    """Flags of the measurement itself (before those of the window's readings)."""
    flags: list[str] = ["counter_invalid"] if idle.counter_went_back else []
    if any(w is None for w in idle.watts):
        flags.append("idle_unavailable")
    if sampler_failed:
        flags.append("sampler_error")
    if align_edges and not aligned:
        flags.append("edge_unaligned")
    return flags


def _whole_window(per_gpu: list[dict], rows: list[dict], idle: IdlePhase, loop: LoopPhase, calls_per_step: int,
                  flags: list[str], reasons_s: dict[str, float], violations: dict[str, float | None],
                  aligned: bool) -> EnergyWindow:
    """The window over every GPU: energies and powers summed, times and utilisation averaged,
    temperatures at their highest."""
    loop_s = loop.t_sync - loop.t_first_call
    energy_j = _sum([g["energy_j"] for g in per_gpu])
    integral_j = _sum([g["integral_j"] for g in per_gpu])
    loop_calls = loop.steps * calls_per_step
    return EnergyWindow(
        available=True,
        reason=None,
        n_gpus=len(per_gpu),
        window_s=_mean([g["window_s"] for g in per_gpu]),
        calls=_mean([g["calls"] for g in per_gpu]),
        sync_window_s=loop_s,
        sync_calls=loop_calls,
        time_per_call_s=loop_s / loop_calls,
        calls_per_step=calls_per_step,
        gpu_util_pct=_mean([g["gpu_util_pct"] for g in per_gpu]),
        mem_util_pct=_mean([g["mem_util_pct"] for g in per_gpu]),
        energy_j=energy_j,
        avg_power_w=_sum([g["avg_power_w"] for g in per_gpu]),
        peak_power_w=_peak_of_sum(rows, len(per_gpu)),
        idle_power_w=_sum(idle.watts),
        energy_per_call_j=_sum([g["energy_per_call_j"] for g in per_gpu]),
        dynamic_energy_per_call_j=_sum([g["dynamic_energy_per_call_j"] for g in per_gpu]),
        temp_start_c=_max([g["temp_start_c"] for g in per_gpu]),
        temp_end_c=_max([g["temp_end_c"] for g in per_gpu]),
        clock_reasons=tuple(reasons_s),
        clock_reasons_s=reasons_s,
        violation_s=violations,
        integral_j=integral_j,
        counter_vs_integral_pct=_pct(energy_j, integral_j),
        flags=tuple(dict.fromkeys(flags)),
        mig=any(g["mig_enabled"] for g in per_gpu),
        edges_aligned=aligned,
        per_gpu=tuple(per_gpu),
        trace=tuple(rows),
    )


# ---- the measurement ----------------------------------------------------------------
def measure_energy(
    call: Callable[[], None],
    sync: Callable[[], None],
    telemetry: Telemetry,
    *,
    min_window_s: float = 3.0,
    idle_settle_s: float = 1.0,
    idle_window_s: float = 1.0,
    sampler_period_s: float = 0.1,
    max_calls: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    align_edges: bool = True,
    edge_timeout_s: float = 0.5,
    calls_per_step: int = 1,
) -> EnergyWindow:
    """Energy of `call()` run back-to-back for at least `min_window_s` on the GPUs of
    `telemetry`. `sync()` must wait for all queued GPU work (torch.cuda.synchronize).
    `clock` must be the clock the telemetry stamps samples with (time.monotonic).
    Set idle_window_s=0 to skip the idle measurement (no dynamic energy then).
    `window_s` runs from the first call to the closing sync, so it exceeds
    `min_window_s` by whatever was still queued on the GPU (on an H200, ~0.85 s of
    1.6 ms matmuls); `calls` and `window_s` always describe the same interval.
    `call()` may run several calls (a CUDA-graph replay of k calls): `calls_per_step`
    says how many, and every count in the result is in calls, not steps. `max_calls`
    counts steps.
    """
    if not telemetry.available:
        return EnergyWindow(available=False, reason=telemetry.reason or "telemetry not available")
    _check_window_arguments(min_window_s, calls_per_step, max_calls)

    identity = telemetry.identity()
    n_gpus = len(identity)
    read_edge = (lambda: await_ticks(telemetry, clock, edge_timeout_s)) if align_edges \
        else (lambda: _read_edge(telemetry, clock))

    sampler = Sampler(telemetry, sampler_period_s)
    sampler.start()
    try:
        idle = _measure_idle(telemetry, read_edge, sync, sleep, n_gpus, idle_settle_s, idle_window_s)
        violations_before = telemetry.violation_ns()
        loop = _run_loop(call, sync, telemetry, read_edge, clock, min_window_s, max_calls)
        if align_edges:
            closing = _find_end_edge(call, sync, telemetry, clock, loop, edge_timeout_s)
        else:
            closing = [EdgeReading(loop.t_sync, value, False, float(loop.steps)) for value in loop.counters_at_sync]
        violations_after = telemetry.violation_ns()
    finally:
        rows = sampler.stop()

    per_gpu = _per_gpu_windows(rows, identity, idle, loop, closing, calls_per_step, sampler_period_s,
                               violations_before, violations_after)
    aligned = (align_edges and idle.aligned and all(r.ticked for r in loop.opening)
               and all(r.ticked for r in closing))
    flags = _measurement_flags(idle, sampler.error is not None, align_edges, aligned)
    window_flags, reasons_s, violations = _window_flags(per_gpu, loop.t_sync - loop.t_first_call)
    flags += window_flags
    _label_phases(rows, idle.span, loop.t_first_call)
    for g in per_gpu:
        del g["instant_power_fallback"]  # reported as a window flag
    return _whole_window(per_gpu, rows, idle, loop, calls_per_step, flags, reasons_s, violations, aligned)


def cooldown(
    telemetry: Telemetry,
    max_temp_c: float | None = None,
    seconds: float | None = None,
    timeout_s: float = 120.0,
    *,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait between cells: `seconds` unconditionally, then until every GPU is at or
    below `max_temp_c` (or `timeout_s` passes). Returns what happened."""
    t0 = clock()
    if seconds:
        sleep(seconds)
    reached = True
    temps: list[Any] = [r.get("gpu_temp_c") for r in telemetry.sample()]
    if max_temp_c is not None and telemetry.available:
        while True:
            temps = [r.get("gpu_temp_c") for r in telemetry.sample()]
            known = [x for x in temps if x is not None]
            if not known or max(known) <= max_temp_c:
                reached = bool(known)
                break
            if clock() - t0 >= timeout_s:
                reached = False
                break
            sleep(poll_s)
    return {"waited_s": clock() - t0, "temp_c": temps, "reached": reached}
