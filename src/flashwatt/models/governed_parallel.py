"""A governed model cell on several GPUs (FSDP or context parallel): one budget for the job.

Every rank runs the step under its own Controller sharing the job's budget over the job's
process group (flashwatt.control.job_power): rank 0's governor decides from every GPU's
readings, every rank paces at its duty (between steps and where each block begins), so no
rank waits on a peer paced harder. On several GPUs pacing is the only knob: the backend and
the batch stay the cell's. `front` runs the uniform static pacing at each of the front's
duties (one duty for every rank). The ranks agree on every step (rank 0's clock decides
when the run ends, broadcast on a gloo group), since a step holds collectives. A rank that
stops answering ends the job or not as `governor.on_peer_loss` says; the record's
`control.fault` says which.
"""
from __future__ import annotations

import time

from flashwatt.models.cell import ModelCell

REST_BEFORE_IDLE_S = 2.0


def measure_governed_parallel(cell: ModelCell, spec: dict, step, model, device, uuid: str | None, rank: int,
                              record: dict, stage) -> list[dict]:
    """The governed cell on this rank; rank 0's trace rows (every GPU's power beside the job's)."""
    import torch
    import torch.distributed as dist

    from flashwatt.control.governor_setting import GovernorSetting
    from flashwatt.control.sensor import idle_power
    from flashwatt.distributed.timing import gather
    from flashwatt.models.step_defaults import DEFAULT_STEPS
    from flashwatt.telemetry import NullTelemetry, open_telemetry

    setting = GovernorSetting.parse(cell.governor)
    settings = spec["governor"]
    telemetry = open_telemetry([uuid]) if uuid else NullTelemetry("no CUDA device")
    answering = gather(telemetry.available)
    if not any(answering):
        telemetry.close()
        record.update(status="skipped", reason=f"governor {cell.governor}: no rank's GPU answers NVML "
                                               f"({telemetry.reason})")
        return []
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    side = dist.new_group(backend="gloo")
    try:
        stage.enter("warm-up")
        for _ in range(max(1, int({**DEFAULT_STEPS, **spec.get("steps", {})}["warmup_steps"]))):
            step.run()
        sync()
        time.sleep(REST_BEFORE_IDLE_S)
        idle_w = idle_power(telemetry, seconds=1.0) if telemetry.available else None
        agree = _agreement(side)
        if setting.mode == "front":
            stage.enter("static front")
            trace = _front(cell, settings, step, model, device, telemetry, idle_w, rank, record, sync, agree)
        else:
            stage.enter("governed steps")
            trace = _governed(cell, setting, settings, step, model, device, telemetry, idle_w, rank, record, sync,
                              agree)
    finally:
        telemetry.close()
    record["control"]["nvml_answering"] = answering
    return trace if rank == 0 else []


def _agreement(side):
    """Rank 0's answer to "another step?", on every rank (a broadcast on the gloo group)."""
    import torch
    import torch.distributed as dist

    def agree(go_on: bool) -> bool:
        flag = torch.tensor([1 if go_on else 0], dtype=torch.int32)
        dist.broadcast(flag, group=side, group_src=0)
        return bool(flag.item())

    return agree


def _controller(mode: str, budget_w, device, telemetry, idle_w, model, settings: dict, **options):
    import torch.distributed as dist

    from flashwatt.control import Controller

    # (the default warm-start cache: a governed run of the job starts where the last one of the
    # same job size on these GPUs left off; rank 0 keeps it, flashwatt.control.controller)
    ctl = Controller(mode, budget_w, device, telemetry=telemetry, idle_w=idle_w, group=dist.group.WORLD,
                     on_peer_loss=settings.get("on_peer_loss", "end"), **options)
    ctl.attach(model)
    return ctl


def _front(cell, settings, step, model, device, telemetry, idle_w, rank, record, sync, agree) -> list[dict]:
    import pandas as pd
    import torch.distributed as dist

    from flashwatt.control.step_study import front_rows, governed_run

    front = settings["front"]

    def run_static(label: str, duty: float):
        with _controller("static", None, device, telemetry, idle_w, model, settings, configuration=label,
                         duty=duty) as ctl:
            return governed_run(ctl, step.run, cell.tokens, float(front["seconds"]), sync=sync, agree=agree)

    rows, traces = front_rows(run_static, ["unchanged"], list(front["duties"]), ranks=dist.get_world_size())
    record["front"] = rows if rank == 0 else None
    record["control"] = {"setting": cell.governor, "idle_w": idle_w, "front_settings": front,
                         "paced": "uniform static pacing: one duty on every rank"}
    trace = pd.concat(traces, ignore_index=True) if traces else pd.DataFrame()
    return trace.assign(source="static front").to_dict("records") if len(trace) else []


def _governed(cell, setting, settings, step, model, device, telemetry, idle_w, rank, record, sync, agree) -> list[dict]:
    from flashwatt.control.step_study import governed_run

    from flashwatt.control.model_steps import PeerLost

    schedule = setting.budget()
    with _controller(setting.controller_mode, schedule.first_w if schedule else None, device, telemetry, idle_w, model,
                     settings, temp_limit_c=setting.temp_limit_c) as ctl:
        try:
            merit, trace = governed_run(ctl, step.run, cell.tokens, float(settings["seconds"]), schedule, sync=sync,
                                        agree=agree)
            warm = ctl.warm_start()  # (before closing, which saves what this run learned)
        except PeerLost as err:  # on_peer_loss "end": the job ends here, and says why
            record.update(status="error", reason=str(err))
            record["control"] = {"setting": cell.governor, "fault": ctl.fault(), "ended": True}
            trace = ctl.trace()
            return trace.assign(source="controller").to_dict("records")
    record["control"] = {"setting": cell.governor, "mode": setting.mode, "schedule": merit.pop("schedule"),
                         "temp_limit_c": setting.temp_limit_c, "seconds": settings["seconds"], "merit": merit,
                         "fault": merit.get("fault"), "on_peer_loss": settings.get("on_peer_loss", "end"),
                         "paced": "together: rank 0's duty on every rank, between and within steps",
                         "warm_start": warm if rank == 0 else None}
    record["timing"] = {"tokens_per_s": merit.get("steady_tokens_per_s") or merit.get("tokens_per_s"),
                        "method": "the governed run's tokens over its seconds (rank 0's clock)"}
    record["energy"] = {"j_per_token": merit.get("steady_j_per_token") or merit.get("j_per_token"),
                        "avg_power_w": merit.get("steady_avg_power_w") or merit.get("avg_power_w"),
                        "method": "NVML energy counters of every GPU of the job, summed, over the governed run"}
    return trace.assign(source="controller").to_dict("records")
