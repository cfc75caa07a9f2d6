"""Work run inside each spawned gloo process of tests/test_control_governed_parallel.py: a
governed model cell on two CPU ranks (FSDP2 over gloo), run as the multi-GPU job runs it on
each task (flashwatt.models.parallel_job), each rank's NVML a fake board of its own
(tests/fake_nvml.py) named by a made-up GPU UUID. Rank 0 writes the record and trace."""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import torch


def main(rank: int, world: int, ports: list[int], out: str, cells: list[tuple[str, dict]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import flashwatt.distributed.energy_window as energy_window
    import flashwatt.models.governed_parallel as governed_parallel
    import flashwatt.telemetry as telemetry
    from fake_nvml import FakeGpu, FakeNvml, uuid_for
    from flashwatt.models.cell import ModelCell
    from flashwatt.models.parallel_job import run_parallel_cell

    gpu = FakeGpu(uuid_for(rank), power_w=100.0 + 20.0 * rank, update_period_s=0.02)
    nvml = FakeNvml([gpu])
    real_open = telemetry.open_telemetry
    telemetry.open_telemetry = lambda uuids, **kw: real_open(None, nvml=nvml)
    energy_window.device_of = lambda device: {"type": "cpu", "uuid": uuid_for(rank)}
    governed_parallel.REST_BEFORE_IDLE_S = 0.0
    try:
        for (path, spec), port in zip(cells, ports):
            os.environ["MASTER_PORT"] = str(port)  # a job of its own per cell, as the workflow starts them
            outcome = run_parallel_cell(ModelCell.from_path(path), spec)
            if rank == 0:
                name = Path(path).stem
                (Path(out) / f"{name}.json").write_text(json.dumps(outcome.record, default=str))
                (Path(out) / f"{name}.trace.json").write_text(json.dumps(outcome.trace, default=str))
        (Path(out) / f"setters-rank{rank}.json").write_text(json.dumps(nvml.setter_calls))
    except Exception:
        (Path(out) / f"error-rank{rank}.txt").write_text(traceback.format_exc())
        raise
