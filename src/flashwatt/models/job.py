"""What a model cell's job runs: build the model, check it, time its step, split out the
attention, and measure the energy of whole steps.

A cell on several GPUs runs flashwatt.models.parallel_job instead (one task supervising a
process per GPU).

Every outcome is a record: ok, incorrect (measured, but a check failed), skipped (the
backend cannot run the model, with why), oom (with the stage that ran out: build, check,
warm-up, timed steps, attention steps, energy window) or error with the traceback.

Timing: `warmup_steps` untimed steps (the compile of a compiled cell among them, its
seconds recorded), then `timed_steps` steps with CUDA events around forward, backward
and optimizer; the record's step time is their median. The attention share is measured
in `attention_steps` steps of their own (flashwatt.models.attention_timer). Energy: the
NVML counter over a window of whole steps run back to back (flashwatt.energy), at least
the suite's `energy_window_s`, warm-up excluded; joules per token = window energy /
tokens in the window. With `steps.paired_rounds`, the cell's backend is then timed
beside the SDPA default in alternating rounds on the same model (flashwatt.models.paired).
"""
from __future__ import annotations

from flashwatt.job_frame import CellOutcome, Job, run_in_frame
from flashwatt.models.attention_share import attention_share
from flashwatt.models.cell import ModelCell
from flashwatt.models.preflight import why_not
from flashwatt.models.record_kind import KIND
from flashwatt.models.step_defaults import DEFAULT_SETTLE_S, DEFAULT_STEPS


def run_model_cell(cell: ModelCell, spec: dict) -> CellOutcome | None:
    """Measure one model cell; never raises for a problem of the cell itself. A cell on
    several GPUs supervises its ranks from this task (flashwatt.models.parallel_job)."""
    from flashwatt.distributed.rendezvous import multicast_off

    multicast_off()  # NVLink multicast stays off in every job (flashwatt.distributed.rendezvous says why)
    if cell.gpus > 1:
        from flashwatt.models.parallel_job import run_parallel_cell

        return run_parallel_cell(cell, spec)
    def body(job: Job) -> list[dict]:
        from flashwatt import measure
        from flashwatt.models.presets import build_config, shape_of
        from flashwatt.settings import MeasureSettings

        settings = MeasureSettings.from_mapping(spec.get("measure", {}))
        device = job.open_device(settings)
        job.stages.enter("build")
        reason = why_not(cell, shape_of(build_config(spec["model"])), device, job.telemetry)
        if reason is not None:
            job.skip(reason)
        with measure.precision_mode(cell):
            return _measure(cell, spec, settings, device, job.telemetry, job.record, job.stages)

    return run_in_frame(KIND, cell, spec, body, first_stage="startup")


def _memory(device) -> dict:
    import torch

    if device.type != "cuda":
        return {}
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_total_bytes": torch.cuda.get_device_properties(device).total_memory}


def _measure(cell: ModelCell, spec: dict, settings, device, telemetry, record: dict, stage) -> list[dict]:
    from flashwatt.models.attention import use_backend
    from flashwatt.models.check import check_model
    from flashwatt.models.step import build_model, make_step, model_record, reference_factory

    seed = int(spec.get("seed", 0))
    train = cell.phase == "train"

    model = build_model(spec["model"], cell.precision, device, seed)
    shape, body, record["model"] = model_record(model, spec["model"])
    if cell.governor:
        from flashwatt.models.governed_job import measure_governed

        return measure_governed(cell, spec, device, telemetry, record, stage, model, shape)
    if cell.control is not None:
        return _measure_controlled(cell, spec, settings, device, telemetry, record, stage, model, shape, body)
    adapter = use_backend(model, cell.backend, cell.precision, train)

    step = make_step(model, cell, device, seed)
    stage.enter("check")
    # A compiled cell is checked through its compiled forward: that is what it times.
    record["check"] = check_model(model, reference_factory(model, device), cell.precision, shape.vocab, train, seed,
                                  forward=step.forward if cell.compiled else None, decode=cell.phase == "decode")
    record["check"]["through"] = "torch.compile'd model" if cell.compiled else "model"
    trace = _time_and_meter(cell, spec, settings, device, telemetry, record, stage, model, shape, body, step)
    if adapter is not None:
        record["attention"]["kv_expanded"] = adapter.kv_expanded
    rounds = int(spec.get("steps", {}).get("paired_rounds", 0))
    if rounds > 0:
        record["paired"] = _paired(cell, spec, settings, device, telemetry, stage, model, step, rounds)
    check = record["check"]
    record["status"] = "ok" if check["passed"] else "incorrect"
    if not check["passed"]:
        record["reason"] = "model check failed: " + _check_failures(check)
    return trace


def _paired(cell: ModelCell, spec: dict, settings, device, telemetry, stage, model, step, rounds: int) -> dict:
    """The cell's backend beside the SDPA default in alternating rounds (flashwatt.models.paired)."""
    from flashwatt.models.attention import use_backend
    from flashwatt.models.paired import paired_rounds, why_unpaired

    reason = why_unpaired(cell)
    if reason is not None:
        return {"reason": reason}
    stage.enter("paired rounds")
    steps = {**DEFAULT_STEPS, **spec.get("steps", {})}
    return paired_rounds(cell, step, device, telemetry, settings, rounds, int(steps["timed_steps"]),
                         switch=lambda name: use_backend(model, name, cell.precision, cell.phase == "train"),
                         implementation=lambda: model.config._attn_implementation)


def _check_failures(check: dict) -> str:
    failed = [k for k in ("logits", "causal", "grad", "decode") if k in check and not check[k]["passed"]]
    return ", ".join(f"{k} {check[k].get('error', check[k].get('prefix_change')):.3g}" for k in failed)


def _measure_controlled(cell: ModelCell, spec: dict, settings, device, telemetry, record: dict, stage, model, shape,
                        body) -> list[dict]:
    """A cell whose attention is the power-aware controller's (flashwatt.models.controlled_attention):
    settle, measure as any cell, then check each configuration that ran while measured."""
    import torch

    from flashwatt.control import ControlError
    from flashwatt.models.check import check_model
    from flashwatt.models.controlled_attention import (calls_between, check_configurations, open_controller, settle,
                                                       use_controller)
    from flashwatt.models.step import make_step, reference_factory

    steps = {**DEFAULT_STEPS, **spec.get("steps", {})}
    seed = int(spec.get("seed", 0))
    mode, budget_w = cell.control
    try:
        controller = open_controller(mode, budget_w, device, telemetry)
    except ControlError as err:
        record.update(status="skipped", reason=f"{cell.backend}: {err}")
        return []
    control = record["control"] = {"mode": mode, "budget_w": budget_w, "idle_w": controller.idle_w,
                                   "limit_w": controller.limit_w}
    try:
        use_controller(model, controller)
        step = make_step(model, cell, device, seed)
        stage.enter("controller settling")
        control["settle"] = settle(step, controller, lambda: torch.cuda.synchronize(device),
                                   float(steps.get("control_settle_s", DEFAULT_SETTLE_S)))
        before = controller.call_counts()
        trace = _time_and_meter(cell, spec, settings, device, telemetry, record, stage, model, shape, body, step)
        control["measured_calls"] = calls_between(before, controller.call_counts())
        control["choices"] = controller.choices()
        control["refusals"] = controller.refusals()
        control["switches_while_measured"] = len(control["measured_calls"]) - 1
        table = controller.model_table()
        control["learned"] = table.to_dict("records")
    finally:
        controller.close()

    stage.enter("check")
    train = cell.phase == "train"
    results = check_configurations(
        model, sorted(control["measured_calls"]), device,
        lambda m: check_model(m, reference_factory(m, device), cell.precision, shape.vocab, train, seed))
    record["check"] = {"passed": bool(results) and all(r["passed"] for r in results.values()),
                       "configurations": results,
                       "through": "model, once per configuration the controller ran while measured, pinned to it, "
                                  "after the measurement"}
    failed = {label: _check_failures(r) for label, r in results.items() if not r["passed"]}
    record["status"] = "ok" if record["check"]["passed"] else "incorrect"
    if failed:
        record["reason"] = "model check failed: " + "; ".join(f"{label}: {why}" for label, why in failed.items())
    return trace


def _time_and_meter(cell: ModelCell, spec: dict, settings, device, telemetry, record: dict, stage, model, shape, body,
                    step) -> list[dict]:
    """Warm-up, timed steps, attention steps and the energy window of a built and switched model."""
    import torch

    from flashwatt.energy import measure_energy
    from flashwatt.models.flops import step_utilisation
    from flashwatt.models.recompute import checkpointed_blocks
    from flashwatt.models.step import time_steps, warm_up

    steps = {**DEFAULT_STEPS, **spec.get("steps", {})}
    train = cell.phase == "train"
    cuda = device.type == "cuda"
    stage.enter("warm-up")
    warm = warm_up(step, device, int(steps["warmup_steps"]))

    stage.enter("timed steps")
    timing = time_steps(step, device, int(steps["timed_steps"]))
    timing["warmup_s"] = warm
    if cell.compiled:
        timing["compile_s"] = warm[0] if warm else None  # the first call compiles
    step_s = timing["step_ms"] / 1e3
    timing["tokens_per_s"] = cell.tokens / step_s
    record["timing"] = timing
    record["memory"] = _memory(device)
    if train:
        record["memory"]["optimizer"] = "AdamW" + (" (fused)" if cuda else "") + f", states in {cell.precision}"
    record["memory"]["recompute"] = cell.recompute  # percent of the decoder blocks
    record["memory"]["recomputed_blocks"] = checkpointed_blocks(model)

    record["flops"] = step_utilisation(shape, body, cell.batch, cell.seq_len, cell.phase, step_s,
                                       (record.get("device") or {}).get("name"), cell.precision)

    stage.enter("attention steps")
    record["attention"] = attention_share(step, model, cell, device, int(steps["attention_steps"]))

    trace: list[dict] = []
    stage.enter("energy window")
    if telemetry.available:
        window = measure_energy(step.run, lambda: torch.cuda.synchronize(device), telemetry,
                                **settings.energy_window())
        energy = window.as_dict()
        energy["unit"] = "one call = one step"
        if window.energy_per_call_j is not None:
            energy["j_per_token"] = window.energy_per_call_j / cell.tokens
            energy["tokens_per_j"] = cell.tokens / window.energy_per_call_j
        if window.time_per_call_s:
            energy["window_tokens_per_s"] = cell.tokens / window.time_per_call_s
        record["energy"] = energy
        trace = [dict(row) for row in window.trace]
    else:
        record["energy"] = {"reason": telemetry.reason}
    return trace
