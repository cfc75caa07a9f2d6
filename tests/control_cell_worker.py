"""The rank job of tests/test_control_governed_parallel.py: one rank of a governed model cell
(flashwatt.models.parallel_job.measure_on_rank, started by the cell's rank supervisor as on a
GPU node), whose NVML is a fake board of its own (tests/fake_nvml.py) named by a made-up GPU
UUID. Each rank writes the NVML setters it was asked for beside the records, and each governed
run's steps, wall time and the idle its pacer paid (what a duty does, whatever the machine's
load)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def measure_on_fake_board(cell, spec: dict):
    import flashwatt.control.step_study as step_study
    import flashwatt.distributed.energy_window as energy_window
    import flashwatt.models.governed_parallel as governed_parallel
    import flashwatt.telemetry as telemetry
    from fake_nvml import FakeGpu, FakeNvml, uuid_for
    from flashwatt.models.parallel_job import measure_on_rank

    spec = dict(spec)
    out = Path(spec.pop("fake_board")["out"])
    rank = int(os.environ["RANK"])
    gpu = FakeGpu(uuid_for(rank), power_w=100.0 + 20.0 * rank, update_period_s=0.02)
    nvml = FakeNvml([gpu])
    real_open = telemetry.open_telemetry
    telemetry.open_telemetry = lambda uuids, **kw: real_open(None, nvml=nvml)
    energy_window.device_of = lambda device: {"type": "cpu", "uuid": uuid_for(rank)}
    governed_parallel.REST_BEFORE_IDLE_S = 0.0
    runs = []
    real_run = step_study.governed_run

    def governed_run(ctl, *args, **kwargs):  # governed_parallel imports it at each call
        t0 = time.monotonic()
        merit, trace = real_run(ctl, *args, **kwargs)
        runs.append({"steps": merit["steps"], "wall_s": time.monotonic() - t0, "slept_s": merit["slept_s"]})
        return merit, trace

    step_study.governed_run = governed_run
    try:
        return measure_on_rank(cell, spec)
    finally:
        (out / f"setters-{cell.governor}-rank{rank}.json").write_text(json.dumps(nvml.setter_calls))
        (out / f"runs-{cell.governor}-rank{rank}.json").write_text(json.dumps(runs))
