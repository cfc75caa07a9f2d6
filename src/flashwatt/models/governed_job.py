"""What a governed model cell's job runs (flashwatt.models.cell: a `governor` setting): the
model's steps under the step-level controller, or the static front it is judged against.

- `front`: every (backend x micro-batch split) of the suite's `governor.front` at each of
  its duties, one static run of `front.seconds` each (a static Controller: the same pacing,
  no decisions), one after another on the same GPU: throughput, average power from the
  energy counter and joules per token per point (`record["front"]`).
- a budget (or schedule, or energy mode, with a temperature limit where named): the steps
  under a Controller for `governor.seconds`, the model attached (its backends through the
  registry, micro-batches and recompute where the knobs allow, pacing points at its
  blocks); the run's figures of merit, its 1 s windows judged against the budget
  (`record["control"]`), and the controller's ticks as the cell's trace.
Before either, every backend it may run is called once (builds load, plans are made) and
the GPU rests for its idle power. After, the model check (flashwatt.models.check) runs
through every backend that ran, as a controller cell's does. A compiled cell is paced
between steps only and keeps its backend (a switch would recompile it).
"""
from __future__ import annotations

import time

from flashwatt.models.cell import ModelCell
from flashwatt.models.step_defaults import DEFAULT_STEPS

REST_BEFORE_IDLE_S = 2.0


def measure_governed(cell: ModelCell, spec: dict, device, telemetry, record: dict, stage, model, shape) -> list[dict]:
    """The governed cell on one GPU (NVML answering: flashwatt.models.preflight); the
    trace's rows (the controller's ticks)."""
    import torch

    from flashwatt.control.governor_setting import GovernorSetting
    from flashwatt.control.sensor import idle_power
    from flashwatt.models.attention import use_backend
    from flashwatt.models.step import make_step

    setting = GovernorSetting.parse(cell.governor)
    settings = spec["governor"]
    train = cell.phase == "train"
    use_backend(model, cell.backend, cell.precision, train)
    step = make_step(model, cell, device, int(spec.get("seed", 0)))
    backends = [cell.backend] if cell.compiled else list(dict.fromkeys([cell.backend, *_backends(settings)]))
    stage.enter("warm-up")
    record["warm_up_refused"] = _warm_up(model, step, cell, backends, device,
                                         int({**DEFAULT_STEPS, **spec.get("steps", {})}["warmup_steps"]))
    use_backend(model, cell.backend, cell.precision, train)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    time.sleep(REST_BEFORE_IDLE_S)
    idle_w = idle_power(telemetry, seconds=1.0)
    if setting.mode == "front":
        stage.enter("static front")
        trace, ran = _front(cell, settings, model, step, device, telemetry, idle_w, record, sync)
    else:
        stage.enter("governed steps")
        trace, ran = _governed(cell, setting, settings, model, step, device, telemetry, idle_w, record, sync)
    stage.enter("check")
    _check(cell, spec, model, shape, device, ran, record)
    return trace


def _backends(settings: dict) -> list[str]:
    return list(settings["knobs"].get("backend") or settings["front"]["backends"])


def _warm_up(model, step, cell: ModelCell, backends: list[str], device, count: int) -> list[dict]:
    """Each backend's steps once (`count` at least one): one-off costs paid before anything is
    measured; the ones that refused, and why."""
    import torch

    from flashwatt.models.attention import use_backend

    refused = []
    for backend in backends:
        try:
            use_backend(model, backend, cell.precision, cell.phase == "train")
            for _ in range(max(1, count)):
                step.run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as err:  # noqa: BLE001 - the runs meet (and record) it too
            refused.append({"backend": backend, "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"})
            model.zero_grad(set_to_none=True)
    return refused


def _controller(cell: ModelCell, mode: str, budget_w, device, telemetry, idle_w, model, **options):
    from flashwatt.control import Controller

    ctl = Controller(mode, budget_w, device, telemetry=telemetry, idle_w=idle_w, **options)
    if not cell.compiled:
        ctl.attach(model, precision=cell.precision, train=cell.phase == "train")
    return ctl


def _front(cell: ModelCell, settings: dict, model, step, device, telemetry, idle_w, record: dict, sync):
    from flashwatt.control.counter_meter import first_counter
    from flashwatt.control.step_study import front_rows, governed_run

    front = settings["front"]
    backends = [cell.backend] if cell.compiled else front["backends"]
    labels = [b + (f" x{m}" if m > 1 else "") for b in backends for m in front["micro_batches"]]

    def run_static(label: str, duty: float):
        with _controller(cell, "static", None, device, telemetry, idle_w, model, configuration=label, duty=duty,
                         cache=None) as ctl:
            return governed_run(ctl, step.run, cell.tokens, float(front["seconds"]), sync=sync,
                                read_counter=first_counter(telemetry))

    rows, traces = front_rows(run_static, labels, list(front["duties"]))
    record["front"] = rows
    record["control"] = {"setting": cell.governor, "idle_w": idle_w, "front_settings": front}
    ran = sorted({row["config"].split()[0] for row in rows if row.get("tokens_per_s")})
    import pandas as pd

    trace = pd.concat(traces, ignore_index=True) if traces else pd.DataFrame()
    return trace.assign(source="static front").to_dict("records") if len(trace) else [], ran


def _governed(cell: ModelCell, setting, settings: dict, model, step, device, telemetry, idle_w, record: dict, sync):
    from flashwatt.control.counter_meter import first_counter
    from flashwatt.control.step_study import governed_run

    schedule = setting.budget()
    knobs = {"backend": _backends(settings), "micro_batches": list(settings["front"]["micro_batches"]),
             **settings["knobs"]} if not cell.compiled else {}
    mix = settings.get("pace_mix")
    pace_mix = (float(mix["low"]), float(mix["period_s"])) if mix else None
    with _controller(cell, setting.controller_mode, schedule.first_w if schedule else None, device, telemetry, idle_w,
                     model, knobs=knobs, temp_limit_c=setting.temp_limit_c, pace_mix=pace_mix) as ctl:
        merit, trace = governed_run(ctl, step.run, cell.tokens, float(settings["seconds"]), schedule, sync=sync,
                                    read_counter=first_counter(telemetry))
        learned = ctl.model_table().to_dict("records")
        warm = ctl.warm_start()
    record["control"] = {"setting": cell.governor, "mode": setting.mode, "schedule": merit.pop("schedule"),
                         "temp_limit_c": setting.temp_limit_c, "knobs": knobs, "seconds": settings["seconds"],
                         "pace_mix": list(pace_mix) if pace_mix else None,
                         "merit": merit, "learned": learned, "warm_start": warm,
                         "paced": "between steps only (compiled)" if cell.compiled else "between and within steps"}
    record["timing"] = {"tokens_per_s": merit.get("steady_tokens_per_s") or merit.get("tokens_per_s"),
                        "method": "the governed run's tokens over its seconds, after exploration where it ended"}
    record["energy"] = {"j_per_token": merit.get("steady_j_per_token") or merit.get("j_per_token"),
                        "avg_power_w": merit.get("steady_avg_power_w") or merit.get("avg_power_w"),
                        "method": "NVML energy counter over the governed run (after exploration where it ended)"}
    ran = sorted({label.split()[0] for label in merit["calls"]})
    return trace.assign(source="controller").to_dict("records"), ran


def _check(cell: ModelCell, spec: dict, model, shape, device, backends: list[str], record: dict) -> None:
    """The model check through every backend that ran; the record's status from it."""
    from flashwatt.models.attention import use_backend
    from flashwatt.models.check import check_model
    from flashwatt.models.step import reference_factory

    train = cell.phase == "train"
    seed = int(spec.get("seed", 0))
    results = {}
    for backend in backends:
        use_backend(model, backend, cell.precision, train)
        results[backend] = check_model(model, reference_factory(model, device), cell.precision, shape.vocab, train,
                                       seed, decode=cell.phase == "decode")
    record["check"] = {"passed": bool(results) and all(r["passed"] for r in results.values()),
                       "configurations": results,
                       "through": "model, once per backend that ran, after the measurement"}
    record["status"] = "ok" if record["check"]["passed"] else "incorrect"
    if not record["check"]["passed"]:
        failed = [b for b, r in results.items() if not r["passed"]]
        record["reason"] = "model check failed through " + ", ".join(failed) if failed else "no backend ran"
