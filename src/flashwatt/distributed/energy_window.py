"""Energy of a step that runs on every rank of a job, over the NVML counters of every GPU.

One window for the whole job: rank 0 runs `flashwatt.energy.measure_energy` (idle
reading, back-to-back steps, counter-aligned edges) over NVML handles of all the job's
GPUs, each GPU's energy taken between its own counter updates and the sum reported. A
step is collective (a ring, an all-to-all, an all-reduce), so the other ranks must run
exactly the steps rank 0 runs: before each step rank 0 broadcasts "go" on a gloo side
group, and "stop" at the end; while rank 0 reads idle power the others wait in that
broadcast, idle too.

NVML reads only the GPUs of its own host: a job over several hosts gets no window, and
its record says so, instead of a sum that silently leaves GPUs out.
"""
from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from flashwatt.distributed.timing import gather


def device_of(device) -> dict:
    """This rank's device as the record names it (and the UUID NVML finds it by)."""
    if device.type != "cuda":
        return {"type": "cpu"}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "uuid": str(getattr(props, "uuid", "")) or None,
            "index": device.index}


def job_telemetry(device, settings, rank: int):
    """Rank 0: telemetry over every GPU of the job (their UUIDs gathered from the ranks);
    the other ranks: None. A NullTelemetry says why there is none. Collective."""
    from flashwatt.telemetry import NullTelemetry, open_telemetry

    where = gather((socket.gethostname(), device_of(device).get("uuid")))
    if rank != 0:
        return None
    hosts = sorted({host for host, _ in where})
    if len(hosts) > 1:
        return NullTelemetry(f"the job's GPUs are on {len(hosts)} hosts ({', '.join(hosts)}); NVML on rank 0's host "
                             "reads only its own GPUs, so no energy sum over the job is taken")
    if device.type != "cuda":
        return NullTelemetry("no CUDA device: energy is measured on NVIDIA GPUs only")
    if not settings.energy:
        return NullTelemetry("energy measurement switched off (measure.energy: false)")
    uuids = [uuid for _, uuid in where]
    if not all(uuids):
        return NullTelemetry("a rank's GPU has no UUID: the job's GPUs cannot be named to NVML")
    return open_telemetry(uuids)


def lockstep_energy(step, sync, telemetry, settings, side, rank: int):
    """The EnergyWindow of `step()` run in lockstep on every rank (rank 0's result; None on
    the others, and where rank 0 has no telemetry). `sync()` waits for rank 0's queued GPU
    work (torch.cuda.synchronize); `side` is a gloo group of all ranks."""
    flag = torch.zeros(1, dtype=torch.int32)

    def say(value: int) -> int:
        flag.fill_(value)
        dist.broadcast(flag, src=0, group=side)
        return int(flag.item())

    if rank != 0:
        while say(0) == 1:
            step()
        return None
    try:
        if telemetry is None or not telemetry.available:
            return None
        from flashwatt.energy import measure_energy

        def call() -> None:
            say(1)
            step()

        return measure_energy(call, sync, telemetry,
                              min_window_s=settings.energy_window_s, idle_settle_s=settings.idle_settle_s,
                              idle_window_s=settings.idle_window_s, sampler_period_s=settings.sampler_period_s)
    finally:
        say(0)
