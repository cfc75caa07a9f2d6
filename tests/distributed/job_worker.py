"""Spawned ranks of the CPU job test: run distributed cells through flashwatt.distributed.job."""
from __future__ import annotations

import json

import torch

SPECS = [
    {"strategy": "zigzag", "gpus": 2, "batch": 1, "heads": 4, "kv_heads": 2, "seq_len": 16, "head_dim": 8,
     "precision": "fp64", "causal": True, "pass": "fwd_bwd", "block": "math", "repeats": 2, "warmup": 1},
    {"strategy": "ulysses", "gpus": 2, "batch": 1, "heads": 2, "kv_heads": 2, "seq_len": 12, "head_dim": 4,
     "precision": "fp64", "causal": False, "pass": "fwd", "block": "auto", "repeats": 2, "warmup": 1},
]
# Four ranks: hybrid on a 2 x 2 mesh (Ulysses pairs inside, a zigzag ring of 2 across).
HYBRID = [{"strategy": "hybrid", "ulysses_size": 2, "gpus": 4, "batch": 1, "heads": 4, "kv_heads": 2, "seq_len": 16,
           "head_dim": 4, "precision": "fp64", "causal": True, "pass": "fwd_bwd", "block": "math", "repeats": 1,
           "warmup": 0}]


def main(rank: int, world: int, ports: list[int], report: str) -> None:
    from flashwatt.distributed.job import job

    torch.set_num_threads(1)
    specs = SPECS if world == 2 else HYBRID
    records = [job(spec, rank=rank, world=world, local_rank=rank, addr="127.0.0.1", port=port)
               for spec, port in zip(specs, ports)]
    if rank == 0:
        with open(report, "w") as fh:
            json.dump(records, fh, indent=1)
    else:
        assert records == [None] * len(specs), "only rank 0 returns a record"
