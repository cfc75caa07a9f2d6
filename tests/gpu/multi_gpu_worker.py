"""Spawned ranks of the multi-GPU test: every spec through flashwatt.distributed.job over NCCL,
one process per GPU; rank 0 writes the records."""
from __future__ import annotations

import json


def main(rank: int, world: int, ports: list[int], specs: list[dict], report: str) -> None:
    from flashwatt.distributed.job import job

    records = [job(spec, rank=rank, world=world, local_rank=rank, addr="127.0.0.1", port=port)
               for spec, port in zip(specs, ports)]
    if rank == 0:
        with open(report, "w") as fh:
            json.dump(records, fh, indent=1, default=str)
