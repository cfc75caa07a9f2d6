"""Work run inside each spawned gloo process of tests/test_control_job_power.py: one simulated
GPU per rank (tests/control_plant.py, in simulated time), each with a real Controller
sharing the job's budget over the process group (flashwatt.control.job_power).

Every rank runs the same model step (as data-parallel ranks do) on a board of its own:
rank r draws (1 + 0.05 r) times rank 0's watts at the same work, so the ranks' power
differs while their step takes as long. Each case writes one JSON file per rank: its board's
truth at every tick, its step count and idle time, its controller's trace (rank 0's holds
every rank's readings), and what happened to the job (the fault, and whether it ended).

Cases, run in order in the same processes: `warm` (the job's warm-start cache under the
output folder, shared by the cases that name it), `late_rank` (that rank starts its controller
`late_s` of real time after the others, as a rank still closing the last one does), `nvml` (rank 1's NVML fails for a while), `die`
(rank `die_rank` exits at `die_at_s` without a word: its peers must neither hang nor go
over budget, and end or go on as `on_peer_loss` says), `closes_first` (that rank closes
while the others still tick), `stall_at_s` (every rank's loop waits `stall_s` on its data
there, the boards idle).
"""
from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from control_plant import PROFILES, Plant, SimStepGpu, StepProfile, sim_controller

STEP = {"unchanged": StepProfile(0.2, 650.0)}
WATTS_STEP = 0.05  # rank r's board draws (1 + r x WATTS_STEP) x the watts of rank 0's


def board(rank: int) -> SimStepGpu:
    return SimStepGpu(Plant(PROFILES), STEP, watts_scale=1.0 + WATTS_STEP * rank, seed=rank)


def run_case(rank: int, case: dict, out: Path) -> None:
    from flashwatt.control.model_steps import PeerLost

    gpu = board(rank)
    if case.get("late_rank") == rank:  # reaches the controller's setup later than a tick's timeout
        time.sleep(case["late_s"])
    if case.get("nvml_dead_rank") == rank:
        gpu.nvml_dead = [tuple(case["nvml_dead_s"])]
    cache = None
    if case.get("warm"):  # one cache for the job's runs, as the cells of a suite share one
        from flashwatt.control.warm_start import WarmStartCache

        cache = WarmStartCache(out / "cache", {"gpu": "sim", "job_ranks": dist.get_world_size()})
    ctl = sim_controller(gpu, budget_w=case["budget_w"], group=dist.group.WORLD,
                         on_peer_loss=case.get("on_peer_loss", "end"), peer_timeout_s=3.0, cache=cache)
    fn = gpu.step_fn(ctl)
    ended = None
    stall_at = case.get("stall_at_s")
    try:
        while gpu.t < case["seconds"]:
            if stall_at is not None and gpu.t >= stall_at:
                gpu.advance(case["stall_s"], None)
                stall_at = None
            if case.get("die_rank") == rank and gpu.t >= case["die_at_s"]:
                os._exit(0)  # a rank that dies: no close, no goodbye
            ctl.step(fn, tokens=gpu.tokens_per_step)
    except PeerLost as err:
        ended = str(err)
    warm = ctl.warm_start()  # (before closing: the shapes it started warm)
    if case.get("closes_first") not in (None, rank):
        # a peer closes first: its goodbye reaches this rank in a tick's exchange, before this
        # rank closes (on GPUs the sensor thread exchanges while the step thread finishes)
        gpu.sleep(0.3)
    warm_after = ctl.warm_start()  # (after a peer's goodbye, where one closed first)
    ctl.close()
    trace = ctl.trace()
    record = {"rank": rank, "truth": gpu.rows, "steps": gpu.steps, "slept_s": ctl.slept_s, "t_end": gpu.t,
              "fault": ctl.fault(), "ended": ended, "warm_start": warm, "warm_start_at_close": warm_after,
              "trace": json.loads(trace.to_json(orient="records"))}
    (out / f"{case['name']}-rank{rank}.json").write_text(json.dumps(record))


def main(rank: int, world: int, port: int, out: str, cases: list[dict]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        for case in cases:
            run_case(rank, case, Path(out))
    except Exception:
        (Path(out) / f"error-rank{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if not any(c.get("die_rank") is not None for c in cases):
            dist.destroy_process_group()
