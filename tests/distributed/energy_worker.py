"""Spawned ranks of the lockstep energy test: a collective step on every rank, rank 0's
window over two fake GPUs; each rank reports how many steps it ran."""
from __future__ import annotations

import datetime
import json
import socket
import sys

import torch
import torch.distributed as dist


def main(rank: int, world: int, port: int, report: str, hosts: list[str]) -> None:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from fake_nvml import FakeGpu, FakeNvml, uuid_for

    from flashwatt.distributed import energy_window
    from flashwatt.settings import MeasureSettings
    from flashwatt.telemetry import open_telemetry

    socket.gethostname = lambda: hosts[rank]  # where each rank says it runs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    settings = MeasureSettings(energy_window_s=0.3, idle_settle_s=0.05, idle_window_s=0.2, sampler_period_s=0.02)
    refused = energy_window.job_telemetry(torch.device("cpu"), settings, rank)
    gpus = [FakeGpu(uuid_for(i), index=i, power_w=60.0, update_period_s=0.02) for i in range(world)]
    telemetry = open_telemetry([g.uuid for g in gpus], nvml=FakeNvml(gpus)) if rank == 0 else None
    steps = {"n": 0}
    token = torch.ones(1)

    def step() -> None:
        if rank == 0 and steps["n"] == 0:
            for g in gpus:
                g.set_power(400.0)
        steps["n"] += 1
        dist.all_reduce(token)  # collective: a rank running one step more or less would hang here
        end = __import__("time").perf_counter() + 0.002
        while __import__("time").perf_counter() < end:
            pass

    side = dist.new_group(backend="gloo")
    window = energy_window.lockstep_energy(step, lambda: None, telemetry, settings, side, rank)
    counts = [None] * world
    dist.all_gather_object(counts, steps["n"])
    if rank == 0:
        with open(report, "w") as fh:
            json.dump({"counts": counts, "refused": getattr(refused, "reason", None),
                       "window": window.as_dict()}, fh, default=str)
    else:
        assert window is None and refused is None
    dist.destroy_process_group()
