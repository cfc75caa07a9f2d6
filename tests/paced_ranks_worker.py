"""Work run inside each spawned gloo process of tests/distributed/test_paced_ranks.py: a
static Controller sharing its job over the process group (flashwatt.control.job_power),
pacing a step whose blocks each compute (a sleep, longer on higher ranks) and then meet the
other ranks at a collective, as an FSDP step's blocks meet at their all-gathers. A rank
that idles at a pacing point makes the others wait at the next collective: the case the
ranks' pacing must not feed back on. Real time, the CPU's clock. Each rank writes one JSON
file: its steps, seconds, the idle it paid and its longest single payment."""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

BLOCKS = 4
BLOCK_S = 0.01  # rank r computes (1 + 0.5 r) x this per block
STEP_AT_DUTY_S = BLOCKS * BLOCK_S * 1.5  # two ranks' step at full duty: the slower rank's compute


def main(rank: int, world: int, port: int, out: str, duty: float, seconds: float) -> None:
    from flashwatt.control import Controller

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    tensor = torch.zeros(1)
    compute_s = BLOCK_S * (1 + 0.5 * rank)

    with Controller("static", device="cpu", configuration="unchanged", duty=duty, cache=None,
                    group=dist.group.WORLD) as ctl:
        pacer = ctl._pacer
        longest = 0.0
        point = pacer.point

        def timed_point(*args, **kwargs) -> float:  # the idle paid at one pacing point
            nonlocal longest
            slept = point(*args, **kwargs)
            longest = max(longest, slept)
            return slept

        pacer.point = timed_point

        def step() -> None:
            for _ in range(BLOCKS):
                ctl.pace()
                time.sleep(compute_s)
                dist.all_reduce(tensor)

        steps, t0 = 0, time.monotonic()
        while steps < round(seconds / STEP_AT_DUTY_S * duty):  # as many steps on every rank
            ctl.step(step, tokens=1)
            steps += 1
        wall = time.monotonic() - t0
        slept = ctl.slept_s
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "steps": steps, "wall_s": wall, "slept_s": slept, "longest_sleep_s": longest}))
    dist.destroy_process_group()
