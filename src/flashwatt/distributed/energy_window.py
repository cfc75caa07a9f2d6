"""Energy of a step that runs on every rank of a job, over the NVML counters of every GPU.

A step is collective (a ring, an all-to-all, an all-reduce), so every rank must run
exactly as many steps as the others, and a GPU waiting in a collective is not idle (NCCL
spins). Whatever measures, the ranks that do not wait on the host, in a gloo group.

- One host: rank 0 runs `flashwatt.energy.measure_energy` (idle reading, back-to-back
  steps, edges on counter updates) over NVML handles of all the job's GPUs; before each
  step it broadcasts "go" on the gloo group, and "stop" at the end. Each GPU's energy is
  taken between its own counter updates; the record gives the sum and each GPU.
- Several hosts: NVML sees only its own host's GPUs, so the first rank of each host
  measures that host's GPUs, all hosts at once, over the same fixed number of steps
  (rank 0 picks it from the step time so that the window lasts `energy_window_s`). The
  hosts' idle readings run together while the other ranks wait in a gloo barrier. The
  step count is fixed beforehand, so the window's edges cannot wait for a counter update
  (another host would run a different number of steps): each edge is up to one update
  period (~100 ms) stale, flagged `edges_unaligned_across_hosts`. Rank 0 sums the hosts.
"""
from __future__ import annotations

import math
import socket
from typing import Callable

import torch
import torch.distributed as dist

from flashwatt.distributed.timing import gather

MULTI_HOST_FLAG = "edges_unaligned_across_hosts"


def device_of(device) -> dict:
    """This rank's device as the record names it (and the UUID NVML finds it by)."""
    if device.type != "cuda":
        return {"type": "cpu"}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "uuid": str(getattr(props, "uuid", "")) or None,
            "index": device.index}


def job_energy(step: Callable[[], None], sync: Callable[[], None], settings, step_s: float, uuid: str | None,
               telemetry_for=None) -> tuple[dict, list[dict]]:
    """Collective: the energy of `step()` summed over every GPU of the job. Rank 0 returns
    (the window as a dict, or {"reason": why none}; the power trace), the others ({}, []).
    `uuid`: this rank's GPU (None without one); `step_s`: about how long a step takes;
    `telemetry_for(uuids)`: telemetry over those GPUs (flashwatt.telemetry.open_telemetry)."""
    if telemetry_for is None:
        from flashwatt.telemetry import open_telemetry as telemetry_for
    rank = dist.get_rank()
    side = dist.new_group(backend="gloo")
    where = gather((socket.gethostname(), uuid))
    reason = _why_none(settings, [u for _, u in where])
    if reason is not None:
        return ({"reason": reason}, []) if rank == 0 else ({}, [])
    if len({host for host, _ in where}) == 1:
        return _one_host(step, sync, settings, side, rank, [u for _, u in where], telemetry_for)
    return _several_hosts(step, sync, settings, side, rank, where, step_s, telemetry_for)


def _why_none(settings, uuids: list[str | None]) -> str | None:
    if all(u is None for u in uuids):
        return "no CUDA device: energy is measured on NVIDIA GPUs only"
    if not settings.energy:
        return "energy measurement switched off (measure.energy: false)"
    if not all(uuids):
        return "a rank's GPU has no UUID: the job's GPUs cannot be named to NVML"
    return None


def _measure(call, sync, telemetry, settings, **options):
    from flashwatt.energy import measure_energy

    return measure_energy(call, sync, telemetry, **(settings.energy_window() | options))


def _one_host(step, sync, settings, side, rank, uuids, telemetry_for) -> tuple[dict, list[dict]]:
    flag = torch.zeros(1, dtype=torch.int32)

    def say(value: int) -> int:
        flag.fill_(value)
        dist.broadcast(flag, src=0, group=side)
        return int(flag.item())

    if rank != 0:
        while say(0) == 1:
            step()
        return {}, []
    telemetry = None
    try:
        telemetry = telemetry_for(uuids)
        if not telemetry.available:
            return {"reason": telemetry.reason}, []

        def call() -> None:
            say(1)
            step()

        window = _measure(call, sync, telemetry, settings)
        return window.as_dict(), [dict(row) for row in window.trace]
    except Exception as err:  # NVML failing mid-window: the cell's timing and check stand without it
        return {"reason": f"energy window failed: {type(err).__name__}: {err}"}, []
    finally:
        say(0)
        if telemetry is not None:
            telemetry.close()


def _several_hosts(step, sync, settings, side, rank, where, step_s, telemetry_for) -> tuple[dict, list[dict]]:
    host = where[rank][0]
    leader = min(r for r, (h, _) in enumerate(where) if h == host)
    steps = [max(1, math.ceil(settings.energy_window_s / max(step_s, 1e-6)))]
    dist.broadcast_object_list(steps, src=0, group=side)
    telemetry = telemetry_for([u for h, u in where if h == host]) if rank == leader else None
    ready = gather(None if telemetry is None or telemetry.available else f"{host}: {telemetry.reason}")
    window = None
    try:
        if any(ready):
            return ({"reason": "; ".join(r for r in ready if r)}, []) if rank == 0 else ({}, [])
        if rank == leader:
            started = []

            def call() -> None:
                if not started:  # every host has read its idle power
                    dist.barrier(group=side)
                    started.append(True)
                step()

            window = _measure(call, sync, telemetry, settings, min_window_s=math.inf, max_calls=steps[0],
                              align_edges=False)
        else:
            dist.barrier(group=side)
            for _ in range(steps[0]):
                step()
            sync()
    finally:
        if telemetry is not None:
            telemetry.close()
    windows = gather(None if window is None else (host, window.as_dict(include_trace=True)))
    if rank != 0:
        return {}, []
    return combine_hosts([w for w in windows if w is not None], steps[0])


def _pct(counter, integral):
    """As flashwatt.energy reports it: the power integral's difference from the counter, in %."""
    return None if counter is None or integral is None or counter <= 0 else 100.0 * (integral - counter) / counter


def _total(values):
    return None if any(v is None for v in values) else sum(values)


def combine_hosts(windows: list[tuple[str, dict]], steps: int) -> tuple[dict, list[dict]]:
    """One job-wide window from each host's: energy and power summed, each GPU listed with
    its host; the window's length and calls averaged over the hosts (they ran the same steps)."""
    parts = [w for _, w in windows]
    per_gpu, trace, offset = [], [], 0
    for host, w in windows:  # GPUs numbered across the job, host after host
        per_gpu += [{**g, "host": host, "gpu": offset + g["gpu"]} for g in w["per_gpu"]]
        trace += [{**row, "host": host, "gpu": offset + row["gpu"]} for row in w.get("trace", [])]
        offset += w["n_gpus"]
    energy_j, integral_j = _total([w["energy_j"] for w in parts]), _total([w["integral_j"] for w in parts])
    flags = list(dict.fromkeys([f for w in parts for f in w["flags"]] + [MULTI_HOST_FLAG]))
    combined = {
        "available": True, "reason": None, "n_gpus": offset, "hosts": [h for h, _ in windows],
        "window_s": sum(w["window_s"] for w in parts) / len(parts),
        "calls": sum(w["calls"] for w in parts) / len(parts),
        "sync_window_s": max(w["sync_window_s"] for w in parts), "sync_calls": steps,
        "time_per_call_s": max(w["time_per_call_s"] for w in parts), "calls_per_step": 1,
        "energy_j": energy_j, "avg_power_w": _total([w["avg_power_w"] for w in parts]),
        "peak_power_w": _total([w["peak_power_w"] for w in parts]),
        "peak_power_meaning": "sum of each host's peak (an upper bound: the hosts' peaks need not coincide)",
        "idle_power_w": _total([w["idle_power_w"] for w in parts]),
        "energy_per_call_j": _total([w["energy_per_call_j"] for w in parts]),
        "dynamic_energy_per_call_j": _total([w["dynamic_energy_per_call_j"] for w in parts]),
        "temp_start_c": max((w["temp_start_c"] for w in parts if w["temp_start_c"] is not None), default=None),
        "temp_end_c": max((w["temp_end_c"] for w in parts if w["temp_end_c"] is not None), default=None),
        "clock_reasons": sorted({r for w in parts for r in w["clock_reasons"]}),
        "integral_j": integral_j,
        "counter_vs_integral_pct": _pct(energy_j, integral_j),
        "flags": flags, "mig": any(w["mig"] for w in parts), "edges_aligned": False, "per_gpu": per_gpu,
    }
    return combined, trace
