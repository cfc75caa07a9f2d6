"""The frame every one-GPU cell job of a whole model runs in (model cells, training
runs): provenance, the device and its NVML telemetry, the cell's precision mode, and the
outcomes that are not the measurement's own.

    outcome = run_measured_job(cell, record, spec.get("measure", {}), body)

`body(device, telemetry, settings, stages)` measures and fills `record` (its status
included) and returns the trace rows. Around it: a kernel's refusal (`UnsupportedCell`)
becomes `skipped`; running out of memory becomes `oom`, naming the stage the body had
entered (`stages.enter(name)`); anything else becomes `error` with the traceback. The
seconds of each stage go to `stages_s` in the record, where a job's time goes.
"""
from __future__ import annotations

import time
import traceback
from typing import Callable

from flashwatt.provenance import provenance, utc_now
from flashwatt.attention.job import CellOutcome


class Stages:
    """The stage a job is in (named by an out-of-memory record) and the seconds spent in
    each, summed over its visits."""

    def __init__(self, record: dict, first: str):
        self.seconds = record.setdefault("stages_s", {})
        self.now, self.since = first, time.perf_counter()

    def enter(self, name: str | None) -> None:
        now = time.perf_counter()
        if self.now is not None:
            self.seconds[self.now] = self.seconds.get(self.now, 0.0) + now - self.since
        self.now, self.since = name, now


def run_measured_job(cell, record: dict, measure_settings: dict, body: Callable) -> CellOutcome:
    """Run `body` for `cell` in the frame; never raises for a problem of the cell itself."""
    t0 = time.perf_counter()
    telemetry = None
    trace: list[dict] = []
    stages = Stages(record, "startup")
    try:
        record["provenance"] = provenance()
        import torch

        from flashwatt import measure
        from flashwatt.kernels.base import UnsupportedCell
        from flashwatt.attention.job import device_identity, open_cell_telemetry, select_device
        from flashwatt.settings import MeasureSettings

        settings = MeasureSettings.from_mapping(measure_settings)
        device = select_device()
        telemetry = open_cell_telemetry(device, settings)
        record["device"] = device_identity(device, telemetry)
        stages.enter("build")
        try:
            with measure.precision_mode(cell):
                trace = body(device, telemetry, settings, stages) or []
        except UnsupportedCell as err:
            record.update(status="skipped", reason=str(err))
        except Exception as err:
            if not measure.is_oom(err):
                raise
            record.update(status="oom", oom_stage=stages.now,
                          reason=f"out of memory during {stages.now}: {str(err).splitlines()[0]}")
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except Exception as err:
        record.update(status="error", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    finally:
        stages.enter(None)
        if telemetry is not None:
            telemetry.close()
        record["finished"] = utc_now()
        record["duration_s"] = round(time.perf_counter() - t0, 3)
    return CellOutcome(record, trace)
