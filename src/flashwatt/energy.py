"""Energy per call from the NVML energy counter, over a window of back-to-back calls.

A kernel that runs 0.1-5 ms cannot be measured by reading power during one call:
NVML updates power and the energy counter only every ~100 ms. So (MEASUREMENT.md):

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

import bisect
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

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
TAIL_BATCH_S = 0.002
MAX_CHECK_BATCH = 64  # calls between two clock checks, at most  # length of one synchronized batch while waiting for the end edge


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
    energy_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    idle_power_w: float | None = None
    energy_per_call_j: float | None = None
    dynamic_energy_per_call_j: float | None = None
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    gpu_util_pct: float | None = None  # NVML utilisation averaged over the window (mean over GPUs)
    mem_util_pct: float | None = None
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
def _await_ticks(telemetry: Telemetry, clock: Callable[[], float], timeout_s: float,
                 base: Sequence[int | None] | None = None):
    """Spin until each GPU's energy counter differs from `base` (default: its value now).

    Returns per GPU (t, counter mJ, ticked). A GPU whose counter did not move before
    the timeout gets the last reading and ticked=False.
    """
    first = list(telemetry.energy_mj()) if base is None else list(base)
    n = len(first)
    t_out: list[float | None] = [None] * n
    e_out: list[int | None] = [None] * n
    t_prev = clock()
    deadline = t_prev + timeout_s
    while True:
        e = telemetry.energy_mj()
        t = clock()
        pending = False
        for i in range(n):
            if t_out[i] is not None or first[i] is None:
                continue
            if e[i] is not None and e[i] != first[i]:
                # the update happened between the previous read and this one
                t_out[i], e_out[i] = (t_prev + t) / 2, e[i]
            else:
                pending = True
        t_prev = t
        if not pending or t >= deadline:
            break
    result = []
    for i in range(n):
        if t_out[i] is None:
            result.append((t, e[i], False))
        else:
            result.append((t_out[i], e_out[i], True))
    return result


def _read_edge(telemetry: Telemetry, clock: Callable[[], float]):
    e = telemetry.energy_mj()
    t = clock()
    return [(t, v, False) for v in e]


def _delta_j(e0: int | None, e1: int | None) -> float | None:
    """Counter delta in J; None when missing, or when the counter went backwards (a
    wrap-around or a reset: the value cannot be trusted)."""
    if e0 is None or e1 is None or e1 < e0:
        return None
    return (e1 - e0) / 1000.0


def _at(ts: list[float], ps: list[float], x: float) -> float:
    if x <= ts[0]:
        return ps[0]
    if x >= ts[-1]:
        return ps[-1]
    k = bisect.bisect_right(ts, x)
    t0, t1 = ts[k - 1], ts[k]
    if t1 == t0:
        return ps[k]
    return ps[k - 1] + (ps[k] - ps[k - 1]) * (x - t0) / (t1 - t0)


def integrate_power(ts: Sequence[float], ps: Sequence[float], a: float, b: float) -> float | None:
    """Trapezoid integral (J) of power samples over [a, b], linear between samples,
    clipped at the edges (interpolated there, held constant beyond the first/last)."""
    if not ts or b <= a:
        return None
    ts, ps = list(ts), list(ps)
    xs = [a] + [t for t in ts if a < t < b] + [b]
    ys = [_at(ts, ps, x) for x in xs]
    return sum((xs[k + 1] - xs[k]) * (ys[k] + ys[k + 1]) / 2.0 for k in range(len(xs) - 1))


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
    `call()` may run several calls of the measured operation (one CUDA-graph replay of
    k calls, flashwatt.timing): `calls_per_step` = k, and every count and per-call
    figure of the result is in calls of the operation, not in steps.
    """
    if not telemetry.available:
        return EnergyWindow(available=False, reason=telemetry.reason or "telemetry not available")
    if min_window_s <= 0:
        raise ValueError(f"min_window_s={min_window_s}: must be positive")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max_calls={max_calls}: must be at least 1")
    if calls_per_step < 1:
        raise ValueError(f"calls_per_step={calls_per_step}: must be at least 1")

    identity = telemetry.identity()
    n = len(identity)
    flags: list[str] = []
    edge = (lambda base=None: _await_ticks(telemetry, clock, edge_timeout_s, base)) if align_edges \
        else (lambda base=None: _read_edge(telemetry, clock))
    aligned = align_edges

    sampler = Sampler(telemetry, sampler_period_s)
    sampler.start()
    try:
        # -- idle -------------------------------------------------------------------
        sync()
        idle_w: list[float | None] = [None] * n
        t_idle = (None, None)
        if idle_window_s > 0:
            if idle_settle_s > 0:
                sleep(idle_settle_s)
            a = edge()
            sleep(idle_window_s)
            b = edge()
            t_idle = (min(x[0] for x in a), max(x[0] for x in b))
            for i in range(n):
                d = _delta_j(a[i][1], b[i][1])
                dt = b[i][0] - a[i][0]
                idle_w[i] = d / dt if d is not None and dt > 0 else None
                if a[i][1] is not None and b[i][1] is not None and b[i][1] < a[i][1]:
                    flags.append("counter_invalid")
            aligned = aligned and all(x[2] for x in a + b)
        if any(w is None for w in idle_w):
            flags.append("idle_unavailable")

        # -- window -----------------------------------------------------------------
        viol0 = telemetry.violation_ns()
        sync()
        start = edge()
        t_start = clock()
        calls = 0
        batch = 1
        t_check = t_start
        while True:
            todo = batch if max_calls is None else min(batch, max_calls - calls)
            for _ in range(todo):
                call()
            calls += todo
            now = clock()
            if now - t_start >= min_window_s or (max_calls is not None and calls >= max_calls):
                break
            # A clock read costs ~0.1 us against ~5 us to launch a kernel: checking every
            # 64 calls is free. Beyond that, growing only overshoots the window, because
            # before the launch queue fills, calls return long before the GPU runs them.
            if now - t_check < 0.01 and batch < MAX_CHECK_BATCH:
                batch *= 2
            t_check = now
        sync()
        t_sync = clock()
        e_sync = telemetry.energy_mj()
        window_s = t_sync - t_start

        # -- end edge: first counter update after the window ---------------------------
        end: list[tuple[float, int | None, float, bool]] = []  # (t, mJ, calls, ticked)
        if align_edges:
            per_call = window_s / calls
            tail = max(1, int(TAIL_BATCH_S / per_call)) if per_call > 0 else 1
            done: list[tuple | None] = [None] * n
            for i in range(n):
                if e_sync[i] is None:
                    done[i] = (t_sync, None, float(calls), False)
            t_prev, c_prev = t_sync, calls
            c = calls
            deadline = t_sync + edge_timeout_s
            while any(d is None for d in done):
                for _ in range(tail):
                    call()
                c += tail
                sync()
                e = telemetry.energy_mj()
                now = clock()
                for i in range(n):
                    if done[i] is None and e[i] is not None and e[i] != e_sync[i]:
                        done[i] = ((t_prev + now) / 2, e[i], (c_prev + c) / 2, True)
                t_prev, c_prev = now, c
                if now >= deadline:
                    for i in range(n):
                        if done[i] is None:
                            done[i] = (now, e[i], float(c), False)
                    break
            end = [d for d in done]  # type: ignore[misc]
        else:
            end = [(t_sync, e_sync[i], float(calls), False) for i in range(n)]
        viol1 = telemetry.violation_ns()
    finally:
        rows = sampler.stop()
    if sampler.error is not None:
        flags.append("sampler_error")
    aligned = aligned and all(s[2] for s in start) and all(x[3] for x in end)
    if align_edges and not aligned:
        flags.append("edge_unaligned")

    # -- per GPU ----------------------------------------------------------------------
    by_gpu: list[list[dict]] = [[] for _ in range(n)]
    for r in rows:
        by_gpu[r["gpu"]].append(r)
    per_gpu: list[dict] = []
    reason_union: dict[str, float] = {}
    for i in range(n):
        g_rows = by_gpu[i]
        t0_i, e0, _ = start[i]
        t1_i, e1, steps_i, _ = end[i]
        calls_i = steps_i * calls_per_step
        delta = _delta_j(e0, e1)
        counter_valid = not (e0 is not None and e1 is not None and e1 < e0)
        # the counter window opened at the update t0_i; energy between it and the first
        # call is idle energy (microseconds on one GPU; up to ~100 ms on several)
        gap = max(0.0, t_start - t0_i)
        if delta is not None and idle_w[i] is not None:
            delta -= idle_w[i] * gap
            win_i = t1_i - t_start
        else:
            win_i = t1_i - t0_i
        limit = identity[i].get("power_limit_max_w") or identity[i].get("power_limit_enforced_w")
        if delta is not None and limit and win_i > 0 and delta / win_i > 3 * limit:
            counter_valid = False  # a jump far beyond the board's limit: a wrap or a reset
        if not counter_valid:
            delta = None
            flags.append("counter_invalid")
        for r in g_rows:
            r["in_window"] = t_start <= r["t"] <= t1_i
        w_rows = [r for r in g_rows if r["in_window"]]
        p_rows = [r for r in g_rows if r.get("power_instant_w") is not None]
        ts = [r["t"] for r in p_rows]
        ps = [r["power_instant_w"] for r in p_rows]
        n_in = sum(1 for r in w_rows if r.get("power_instant_w") is not None)
        integral = integrate_power(ts, ps, t_start, t1_i) if n_in >= 2 else None
        if any(r.get("power_instant_fallback") for r in p_rows):
            flags.append("instant_power_fallback")
        counts: dict[str, int] = {}
        for r in w_rows:
            for name in decode_clock_reasons(r.get("clock_reasons")):
                counts[name] = counts.get(name, 0) + 1
        reasons_s = {k: v * sampler_period_s for k, v in sorted(counts.items())}
        for k, v in reasons_s.items():
            reason_union[k] = max(reason_union.get(k, 0.0), v)
        viol: dict[str, float | None] = {}
        for name in (viol0[i] if i < len(viol0) else {}):
            v0, v1 = viol0[i].get(name), viol1[i].get(name)
            viol[name] = None if v0 is None or v1 is None or v1 < v0 else (v1 - v0) / 1e9
        energy_per_call = delta / calls_i if delta is not None and calls_i > 0 else None
        dyn = None
        if energy_per_call is not None and idle_w[i] is not None:
            dyn = (delta - idle_w[i] * win_i) / calls_i
        per_gpu.append({
            "gpu": i,
            "uuid": identity[i].get("uuid"),
            "name": identity[i].get("name"),
            "window_s": win_i,
            "calls": calls_i,
            "energy_j": delta,
            "avg_power_w": delta / win_i if delta is not None and win_i > 0 else None,
            "peak_power_w": _max([r.get("power_instant_w") for r in w_rows]),
            "idle_power_w": idle_w[i],
            "energy_per_call_j": energy_per_call,
            "dynamic_energy_per_call_j": dyn,
            "temp_start_c": _nearest_before(g_rows, t_start, "gpu_temp_c"),
            "temp_end_c": _first_after(g_rows, t1_i, "gpu_temp_c"),
            "mem_temp_start_c": _nearest_before(g_rows, t_start, "mem_temp_c"),
            "mem_temp_end_c": _first_after(g_rows, t1_i, "mem_temp_c"),
            "samples_in_window": n_in,
            # NVML's utilisation: the share of its sample period a kernel ran (SM) or
            # memory was read or written, averaged over the window's samples.
            "gpu_util_pct": _mean([r.get("gpu_util_pct") for r in w_rows]),
            "mem_util_pct": _mean([r.get("mem_util_pct") for r in w_rows]),
            "integral_j": integral,
            "counter_vs_integral_pct": _pct(delta, integral),
            "clock_reasons": sorted(counts),
            "clock_reasons_s": reasons_s,
            "violation_s": viol,
            "counter_valid": counter_valid,
            "mig_enabled": bool(identity[i].get("mig_enabled")),
        })

    # -- totals -----------------------------------------------------------------------
    energy_j = _sum([g["energy_j"] for g in per_gpu])
    integral_j = _sum([g["integral_j"] for g in per_gpu])
    if integral_j is None:
        flags.append("too_few_samples")
    pct = _pct(energy_j, integral_j)
    if pct is not None and abs(pct) > COUNTER_VS_INTEGRAL_LIMIT_PCT:
        flags.append("counter_vs_integral>5%")
    if window_s < MIN_TRUSTED_WINDOW_S:
        flags.append("window_too_short")
    mig = any(g["mig_enabled"] for g in per_gpu)
    if mig:
        flags.append("mig_whole_gpu")
    viol_total: dict[str, float | None] = {}
    for g in per_gpu:
        for k, v in g["violation_s"].items():
            if v is None:
                viol_total.setdefault(k, None)
            else:
                prev = viol_total.get(k)
                viol_total[k] = v if prev is None else max(prev, v)
    if reason_union.keys() & THERMAL_REASONS or (viol_total.get("thermal") or 0) > 0:
        flags.append("throttled_thermal")
    if reason_union.keys() & POWER_REASONS or (viol_total.get("power") or 0) > 0:
        flags.append("power_capped")
    if reason_union.keys() & HW_SLOWDOWN_REASONS:
        flags.append("hw_slowdown")

    # peak of the summed power: sampler rounds inside every GPU's window
    rounds: dict[int, list[float]] = {}
    for r in rows:
        if r.get("in_window") and r.get("power_instant_w") is not None:
            rounds.setdefault(r["sample"], []).append(r["power_instant_w"])
    peak = _max([sum(v) for v in rounds.values() if len(v) == n]) if rounds else None

    t_idle_a, t_idle_b = t_idle
    for r in rows:
        t = r["t"]
        if r["in_window"]:
            r["phase"] = "window"
        elif t_idle_a is not None and t_idle_a <= t <= t_idle_b:
            r["phase"] = "idle"
        elif t < t_start:
            r["phase"] = "settle"
        else:
            r["phase"] = "after"

    return EnergyWindow(
        available=True,
        reason=None,
        n_gpus=n,
        window_s=_mean([g["window_s"] for g in per_gpu]),
        calls=_mean([g["calls"] for g in per_gpu]),
        sync_window_s=window_s,
        sync_calls=calls * calls_per_step,
        time_per_call_s=window_s / (calls * calls_per_step),
        energy_j=energy_j,
        avg_power_w=_sum([g["avg_power_w"] for g in per_gpu]),
        peak_power_w=peak,
        idle_power_w=_sum(idle_w),
        energy_per_call_j=_sum([g["energy_per_call_j"] for g in per_gpu]),
        dynamic_energy_per_call_j=_sum([g["dynamic_energy_per_call_j"] for g in per_gpu]),
        temp_start_c=_max([g["temp_start_c"] for g in per_gpu]),
        temp_end_c=_max([g["temp_end_c"] for g in per_gpu]),
        gpu_util_pct=_mean([g["gpu_util_pct"] for g in per_gpu]),
        mem_util_pct=_mean([g["mem_util_pct"] for g in per_gpu]),
        clock_reasons=tuple(sorted(reason_union)),
        clock_reasons_s=dict(sorted(reason_union.items())),
        violation_s=viol_total,
        integral_j=integral_j,
        counter_vs_integral_pct=pct,
        flags=tuple(dict.fromkeys(flags)),
        mig=mig,
        edges_aligned=aligned,
        per_gpu=tuple(per_gpu),
        trace=tuple(rows),
    )


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
