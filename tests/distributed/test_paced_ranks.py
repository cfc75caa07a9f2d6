"""Ranks of one job paced at a duty under 0.5 while their steps meet at collectives
(tests/paced_ranks_worker.py, 2 gloo processes, real time): every rank idles at the same
points for as long, so none idles again for the time it waited on a peer's idle. Counted
as its own busy time, that wait made it owe (1 - d) / d times as much idle, its peer
waited that out and owed it back: below duty 0.5 the idle grew step after step until
the NCCL watchdog ended the job (two H100s, a static front's 0.4 and 0.3 points)."""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

import paced_ranks_worker
from support import free_ports

pytestmark = pytest.mark.slow


def test_ranks_paced_below_half_duty_idle_together_and_keep_their_duty(tmp_path):
    world, duty, seconds = 2, 0.3, 4.0
    mp.spawn(paced_ranks_worker.main, args=(world, free_ports(1)[0], str(tmp_path), duty, seconds), nprocs=world,
             join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    # a step's blocks take the slower rank's compute, 4 x 15 ms; at duty 0.3 a step lasts
    # 200 ms: the run about 4 s. The bounds leave room for a loaded host (a sleep that
    # oversleeps, a collective scheduled late); paid alone, the idle grew to 0.34 s by the
    # fourth point and past 9 s by the eighth, and the run never ended
    for rank in ranks:
        # a point's idle is (1 - d) / d of a block's 15 ms, 35 ms, and does not grow
        assert 0.0 < rank["longest_sleep_s"] <= 0.3, rank
        assert rank["wall_s"] <= 2.0 * seconds, rank
        # the idle each rank paid itself is about (1 - duty) of the run, not more
        assert rank["slept_s"] <= 1.2 * (1 - duty) * rank["wall_s"], rank
