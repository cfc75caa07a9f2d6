"""The communication split of multi-GPU model steps on real NCCL kernels: profiling only the
device's activity (flashwatt.models.comm_timeline) still sees every kernel, NCCL's among them,
and the exposed communication stays a part of the step it was measured in.

Two ranks over NCCL, each step a matmul, an all-reduce of its result (nothing to hide it
under: exposed) and a second matmul while a second all-reduce runs on its own stream
(hidden). Needs two GPUs (tests/gpu/conftest.py).
"""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from support import free_ports

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]


def _rank(rank: int, port: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from flashwatt.models.comm_timeline import communication_split

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            device_id=device, timeout=datetime.timedelta(seconds=60))
    x = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    side = torch.cuda.Stream(device)

    def run():
        y = x @ x
        dist.all_reduce(y)                      # waited for: exposed
        z = torch.randn(64 << 20, device=device, dtype=torch.bfloat16)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(z)                  # under the matmuls below: hidden
        for _ in range(8):
            y = y @ x
        torch.cuda.current_stream().wait_stream(side)

    for _ in range(2):
        run()
    torch.cuda.synchronize(device)
    result = communication_split(run, device, 3, before=dist.barrier)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)


def test_the_split_sees_nccl_kernels_and_keeps_exposed_within_the_step(tmp_path):
    out = tmp_path / "split.json"
    mp.spawn(_rank, args=(free_ports(1)[0], str(out)), nprocs=2, join=True)
    split = json.loads(out.read_text())
    print(split)
    assert split["communication_ms"] > 0 and "allreduce" in split["by_kind_ms"], split
    assert 0 < split["exposed_ms"] <= split["communication_ms"] <= split["step_ms"]
    assert 0 < split["exposed_share_of_step"] <= 1 and split["hidden_ms"] > 0
