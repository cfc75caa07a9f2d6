"""Spawned ranks of the job energy tests: a collective step on every rank, energy read from
fake GPUs (one per rank) by whoever flashwatt.distributed.energy_window picks; each rank
reports how many steps it ran."""
from __future__ import annotations

import datetime
import json
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEP_S = 0.002


def main(rank: int, world: int, port: int, report: str, hosts: list[str], with_gpus: bool,
         broken_nvml: bool = False) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fake_nvml import FakeGpu, FakeNvml, uuid_for

    from flashwatt.distributed import energy_window
    from flashwatt.settings import MeasureSettings
    from flashwatt.telemetry import open_telemetry

    socket.gethostname = lambda: hosts[rank]  # where each rank says it runs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    settings = MeasureSettings(energy_window_s=0.3, idle_settle_s=0.05, idle_window_s=0.2, sampler_period_s=0.02)
    gpus = [FakeGpu(uuid_for(i), index=i, power_w=60.0, update_period_s=0.005) for i in range(world)]
    opened: list = []

    def telemetry_for(uuids):
        opened.append(list(uuids))
        if broken_nvml:
            raise RuntimeError("NVML gone")
        return open_telemetry(uuids, nvml=FakeNvml(gpus))

    steps = {"n": 0}
    token = torch.ones(1)

    def step() -> None:
        if steps["n"] == 0:  # the GPUs this process measures start drawing their load
            for g in gpus:
                g.set_power(400.0)
        steps["n"] += 1
        dist.all_reduce(token)  # collective: a rank running one step more or less would hang here
        end = time.perf_counter() + STEP_S
        while time.perf_counter() < end:
            pass

    energy, trace = energy_window.job_energy(step, lambda: None, settings, STEP_S,
                                             uuid_for(rank) if with_gpus else None, telemetry_for)
    counts, measured = [None] * world, [None] * world
    dist.all_gather_object(counts, steps["n"])
    dist.all_gather_object(measured, opened)
    if rank == 0:
        with open(report, "w") as fh:
            json.dump({"counts": counts, "opened": measured, "energy": energy, "trace_gpus": sorted(
                {row["gpu"] for row in trace}), "uuids": [uuid_for(i) for i in range(world)]}, fh, default=str)
    else:
        assert (energy, trace) == ({}, [])
    dist.destroy_process_group()
