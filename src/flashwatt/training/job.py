"""What a training cell's job runs: build the model on its backend, check it, train it to
its token budget with evaluations, and record the curve against tokens, time and energy.

Every outcome is a record: ok; diverged (a non-finite loss, at the step it happened, with
the curve up to there); incorrect (the step-0 check of the backend against the float32
math model failed: nothing is trained on a backend that computes something else);
skipped (with why: a precision the device cannot run, dropout on a model without residual
dropout, a context longer than the model's positions); oom (with the stage); or error
with the traceback.

Resume: a job requeued after preemption or at its time limit loads the run's checkpoint
(flashwatt.training.checkpoint) and goes on; `resumes` in the record lists each resume
and what the lost job had done past the checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

from flashwatt.job_frame import CellOutcome, Job, run_in_frame
from flashwatt.provenance import utc_now
from flashwatt.training.cell import TrainCell, refusal_without_cuda

KIND = "train"


def read_manifest(path: str | Path) -> dict:
    """The suite's data manifest (flashwatt.training.data): where its token shards are."""
    return json.loads(Path(path).read_text())


def why_not(cell: TrainCell, spec: dict, shape, family: str, device) -> str | None:
    """Why the run cannot happen here (before the model is built), or None."""
    from flashwatt.models.cell import TRANSFORMERS_BACKENDS
    from flashwatt.models.presets import has_residual_dropout

    if device.type == "cpu" and refusal_without_cuda(cell) is not None:
        return refusal_without_cuda(cell)
    if cell.precision == "bf16" and device.type == "cuda":
        import torch

        if not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16"
    if cell.context > shape.max_positions:
        return f"context {cell.context} is longer than {cell.model}'s {shape.max_positions} positions"
    if cell.dropout > 0 and not has_residual_dropout(family):
        return (f"dropout {cell.dropout:g}: a {family} model has no residual dropout (its only dropout is on "
                f"attention probabilities, which the kernels do not take)")
    if cell.backend not in TRANSFORMERS_BACKENDS:  # the registry's answer for the model's attention calls
        from flashwatt.kernels import AttentionCall, get_kernel

        call = AttentionCall(precision=cell.precision, seq_len=cell.context, batch=cell.batch, heads=shape.heads,
                             head_dim=shape.head_dim, causal=True, pass_="fwd_bwd", kv_heads=shape.kv_heads)
        return get_kernel(cell.backend).supports(call, device)
    return None


def run_train_cell(cell: TrainCell, spec: dict) -> CellOutcome:
    """Train one cell; never raises for a problem of the cell itself."""
    steps: list[dict] = []  # the per-step trace, kept whatever ends the run

    def body(job: Job) -> None:
        from flashwatt import measure
        from flashwatt.settings import MeasureSettings

        device = job.open_device(MeasureSettings.from_mapping(spec.get("measure", {})))
        job.stages.enter("build")
        with measure.precision_mode(cell):
            _train(cell, spec, device, job.telemetry, job.record, job.stages, steps)

    return CellOutcome(run_in_frame(KIND, cell, spec, body, first_stage="startup").record, steps)


def _train(cell: TrainCell, spec: dict, device, telemetry, record: dict, stage, steps: list[dict]) -> None:
    """The run, stage by stage: data, model, step-0 check, setup (or resume), training with
    evaluations, summary. `steps` receives the per-step trace however the run ends."""
    import torch

    from flashwatt.models.presets import build_config, shape_of
    from flashwatt.training.loop import eval_points
    from flashwatt.training.meter import RunMeter

    shards, vocab = _open_shards(spec, record)
    config = build_config(spec["model"], cell.dropout, vocab_size=vocab)
    shape = shape_of(config)
    reason = why_not(cell, spec, shape, config.model_type, device)
    if reason is None and cell.governor and not telemetry.available:
        reason = f"governor {cell.governor}: the step-level controller needs live power readings from NVML " \
                 f"({telemetry.reason})"
    if reason is not None:
        record.update(status="skipped", reason=reason)
        return

    data = _batches(cell, spec, shards, device)
    model, adapter = _build_model(cell, spec, config, shape, vocab, device, record)

    stage.enter("check")
    if not _passes_step_zero_check(cell, model, adapter, vocab, device, record):
        return

    stage.enter("setup")
    trainer, optimizer, warmup = _make_trainer(cell, spec, model, data, device)
    checkpoints, resumes, carried = _resume(cell, spec, shards, trainer, device, record)
    record.update(resumes=resumes, run={"total_steps": cell.steps, "warmup_steps": warmup,
                                        "tokens_per_step": cell.tokens_per_step,
                                        "tokens_trained": cell.steps * cell.tokens_per_step,
                                        "eval_steps": eval_points(cell.steps, int(spec["evaluation"]["evals"])),
                                        "grad_clip": trainer.grad_clip, "betas": list(optimizer.defaults["betas"])})

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    governed = _govern(cell, spec, trainer, device, telemetry)
    meter = RunMeter(telemetry, sync, carried)
    try:
        _train_and_evaluate(cell, spec, trainer, optimizer, checkpoints, meter, resumes, record["run"]["eval_steps"],
                            stage)
    finally:
        totals = meter.close()
        # Kept whatever ends the run: an out-of-memory or a crash keeps the evaluations and steps done.
        record["curve"] = trainer.curve
        steps[:] = trainer.steps
        if governed is not None:
            record["control"], ticks = governed.close(trainer.step * cell.tokens_per_step)
            steps.extend(ticks)
    stage.enter("summary")
    _summarise(cell, spec, record, trainer, totals, device, telemetry)
    checkpoints.clear()


def _govern(cell: TrainCell, spec: dict, trainer, device, telemetry):
    """The run's controller (flashwatt.training.governed), its steps and evaluations put
    under it; None for a run without a governor."""
    if not cell.governor:
        return None
    from flashwatt.training.governed import GovernedRun

    governed = GovernedRun(cell, spec, trainer.model, device, telemetry)
    trainer.controller, trainer.before_step = governed.controller, governed.before_step
    return governed


def _open_shards(spec: dict, record: dict):
    """The suite's token shards and their vocabulary size; where they came from goes into the record."""
    from flashwatt.training.shards import open_shards

    manifest = read_manifest(spec["data"])
    shards = open_shards(manifest["shards"])
    vocab = int(shards.meta["tokenizer"]["vocab_size"])
    record["data"] = {"manifest": spec["data"], "shards": manifest["shards"], "corpus": shards.meta["corpus"],
                      "tokenizer": shards.meta["tokenizer"], "tokens": shards.meta["tokens"]}
    return shards, vocab


def _batches(cell: TrainCell, spec: dict, shards, device):
    """The cell's training batches (seeded) and its validation windows, on the device."""
    from flashwatt.training.loop import Batches
    from flashwatt.training.shards import BatchSampler, validation_windows

    where = f"suites.{cell.suite}.training"
    evaluation = spec["evaluation"]
    sampler = BatchSampler(shards.tokens("train"), batch=cell.batch, context=cell.context, seed=cell.seed,
                           key=f"{where}.grids (context)")
    val_inputs, val_targets = validation_windows(shards.tokens("validation"), context=cell.context,
                                                 count=int(evaluation["validation_windows"]),
                                                 key=f"{where}.evaluation.validation_windows")
    return Batches(sampler, val_inputs.to(device), val_targets.to(device), int(evaluation.get("batch") or cell.batch))


def _build_model(cell: TrainCell, spec: dict, config, shape, vocab: int, device, record: dict):
    """The model in float32 with random seeded weights, switched to the cell's attention
    backend: (model, the backend's adapter or None). What was built goes into the record."""
    from flashwatt.models.attention import use_backend
    from flashwatt.models.step import build_model

    model = build_model(spec["model"], "fp32", device, cell.seed, cell.dropout, vocab_size=vocab)
    record["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "family": config.model_type,
                       "shape": shape.__dict__, "vocab_size": vocab, "weights": "float32, random (seeded)",
                       "dropout": {"residual_and_embedding": cell.dropout, "attention": 0.0},
                       "arithmetic": f"autocast to {cell.precision}" if cell.precision in ("bf16", "fp16")
                       else cell.precision}
    return model, use_backend(model, cell.backend, cell.precision, train=True)


def _passes_step_zero_check(cell: TrainCell, model, adapter, vocab: int, device, record: dict) -> bool:
    """The step-0 check of the model on its backend against the float32 math model, without
    dropout; a failed check makes the record `incorrect` (nothing is trained then)."""
    from flashwatt.models.check import check_model
    from flashwatt.models.step import reference_factory
    from flashwatt.training.loop import autocast_of

    autocast = autocast_of(cell.precision, device)
    with _dropout_off(model):
        record["check"] = check_model(model, reference_factory(model, device), cell.precision, vocab, True,
                                      cell.seed, autocast=autocast)
    if adapter is not None:
        record["check"]["kv_expanded"] = adapter.kv_expanded
    if not record["check"]["passed"]:
        failed = [k for k in ("logits", "causal", "grad") if not record["check"][k]["passed"]]
        record.update(status="incorrect", reason="step-0 check failed (" + ", ".join(failed) + "): not trained")
        return False
    return True


def _make_trainer(cell: TrainCell, spec: dict, model, data, device):
    """(trainer, optimizer, warm-up steps): the cell's optimizer and schedule over its steps."""
    from flashwatt.training.loop import Trainer
    from flashwatt.training.optimizers import make_optimizer
    from flashwatt.training.schedules import make_schedule, warmup_steps

    total = cell.steps
    warmup = warmup_steps(total, spec["warmup_fraction"])
    schedule_cfg = spec.get("schedule", {})
    optimizer = make_optimizer(cell.optimizer, model.parameters(), cell.lr, cell.weight_decay,
                               betas=spec.get("betas", {}).get(cell.optimizer))
    schedule = make_schedule(cell.schedule, optimizer, total, warmup, **schedule_cfg)
    trainer = Trainer(cell, model, optimizer, schedule, data, device, float(spec.get("grad_clip", 1.0)))
    return trainer, optimizer, warmup


def _resume(cell: TrainCell, spec: dict, shards, trainer, device, record: dict):
    """The run's checkpoints; where one of this run exists, the trainer goes on from it.
    Returns (checkpoints, the list of resumes, the meter totals carried over or None);
    each resume notes what the job that died had done past the checkpoint."""
    from flashwatt.training.checkpoint import Checkpoints, run_fingerprint

    fingerprint = run_fingerprint(cell.id, {**spec, "data_fingerprint": [shards.meta["corpus"].get("fingerprint"),
                                                                        shards.meta["tokenizer"]["fingerprint"]]})
    checkpoints = Checkpoints(spec["cache"], cell.id, fingerprint)
    state, note = checkpoints.load(device)
    resumes, carried = [], None
    if note:
        record["checkpoint_note"] = note
    if state is not None:
        lost = checkpoints.progress() or {}
        trainer.load(state)
        carried, resumes = state["meter"], state["resumes"]
        resume = {"at_step": trainer.step, "at": utc_now()}
        if lost.get("step", -1) > trainer.step:  # how far the job that died had got past the checkpoint
            resume["lost_steps"] = lost["step"] - trainer.step
            for key in ("wall_s", "energy_j"):
                if lost.get(key) is not None and carried.get(key) is not None:
                    resume[f"lost_{key}"] = lost[key] - carried[key]
        resumes.append(resume)
    return checkpoints, resumes, carried


def _train_and_evaluate(cell: TrainCell, spec: dict, trainer, optimizer, checkpoints, meter, resumes: list,
                        eval_steps: list[int], stage) -> None:
    """Train to each evaluation point still ahead, evaluate there and add the curve's row;
    checkpoint every `checkpoint_every_s`; stop at a non-finite loss (trainer.diverged)."""
    every_s = float(spec.get("checkpoint_every_s", 60.0))
    last_checkpoint = meter.wall_s()
    points = [p for p in eval_steps if p >= trainer.step]
    if trainer.curve and points and points[0] == trainer.step:
        points = points[1:]  # the checkpoint's own evaluation is already in the curve
    for point in points:
        since = trainer.step
        stage.enter("training steps")
        with meter.part("train"):
            trainer.train_until(point)
        if trainer.diverged:
            break
        stage.enter("evaluation")
        with meter.part("eval"):
            val = trainer.evaluate()
        row = {"step": trainer.step, "tokens": trainer.step * cell.tokens_per_step, "val_loss": val,
               "train_loss": trainer.segment_loss(since), "current_lr": optimizer.param_groups[0]["lr"],
               **meter.totals()}
        trainer.curve.append(row)
        checkpoints.note_progress(row)
        if val != val or val in (float("inf"), float("-inf")):
            trainer.diverged = {"step": trainer.step, "loss": val, "where": "validation loss"}
            break
        if trainer.step < cell.steps and meter.wall_s() - last_checkpoint >= every_s:
            stage.enter("checkpoint")
            with meter.part("checkpoint"):
                checkpoints.save({**trainer.state(), "meter": meter.totals(), "resumes": resumes})
            last_checkpoint = meter.wall_s()


class _dropout_off:
    """Every dropout module at p=0 for the check (it compares against a model without
    dropout), restored afterwards."""

    def __init__(self, model):
        import torch

        self.modules = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]

    def __enter__(self):
        self.saved = [m.p for m in self.modules]
        for m in self.modules:
            m.p = 0.0

    def __exit__(self, *exc):
        for m, p in zip(self.modules, self.saved):
            m.p = p


def _summarise(cell: TrainCell, spec: dict, record: dict, trainer, totals: dict, device, telemetry) -> None:
    import math

    import torch

    curve = trainer.curve
    trained = trainer.step * cell.tokens_per_step
    record["timing"] = {"train_s": totals["train_s"], "eval_s": totals["eval_s"],
                        "checkpoint_s": totals["checkpoint_s"], "wall_s": totals["wall_s"],
                        "tokens_trained": trained,
                        "tokens_per_s": trained / totals["train_s"] if totals["train_s"] > 0 else None,
                        "steady_tokens_per_s": _steady_throughput(curve),
                        "eval_share": totals["eval_s"] / totals["wall_s"] if totals["wall_s"] > 0 else None,
                        "method": "wall clock between synchronisations; tokens/s over training steps only "
                                  "(steady: from the first evaluation after step 0 on, past the first steps' "
                                  "one-off costs)"}
    if telemetry.available and totals["energy_j"] is not None:
        energy = totals["energy_j"]
        record["energy"] = {"energy_j": energy, "j_per_token": energy / trained if trained else None,
                            "mean_power_w": energy / totals["wall_s"] if totals["wall_s"] > 0 else None,
                            "peak_power_w": totals["peak_power_w"],
                            "method": "NVML energy counter from the run's start (on a counter update) to each "
                                      "evaluation; evaluations and checkpoints included"}
    else:
        record["energy"] = {"energy_j": None, "reason": telemetry.reason if not telemetry.available
                            else "the energy counter could not be read"}
    if device.type == "cuda":
        record["memory"] = {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    final = curve[-1] if curve else None
    record["final"] = {"step": trainer.step, "val_loss": final["val_loss"] if final else None,
                       "perplexity": math.exp(final["val_loss"]) if final and math.isfinite(final["val_loss"])
                       else None, "initial_val_loss": curve[0]["val_loss"] if curve else None}
    record["target"] = target_reached(curve, spec.get("target_loss"))
    if trainer.diverged:
        record.update(status="diverged", diverged=trainer.diverged,
                      reason=f"{trainer.diverged['where']} {trainer.diverged['loss']} at step {trainer.diverged['step']}")
    else:
        record["status"] = "ok"


def _steady_throughput(curve: list[dict]) -> float | None:
    """Tokens per training second from the first evaluation after step 0 to the last."""
    later = [row for row in curve if row["step"] > 0]
    if len(later) < 2 or later[-1]["train_s"] <= later[0]["train_s"]:
        return None
    return (later[-1]["tokens"] - later[0]["tokens"]) / (later[-1]["train_s"] - later[0]["train_s"])


def target_reached(curve: list[dict], target: float | None) -> dict:
    """The first evaluation at or below the target validation loss: its tokens, seconds and
    joules (measured at that evaluation: the resolution is one evaluation interval)."""
    if target is None:
        return {"loss": None, "reached": None, "reason": "the suite names no target_loss"}
    for row in curve:
        if row["val_loss"] <= target:
            return {"loss": target, "reached": True, "step": row["step"], "tokens": row["tokens"],
                    "wall_s": row["wall_s"], "train_s": row["train_s"], "energy_j": row["energy_j"]}
    return {"loss": target, "reached": False, "best_val_loss": min((r["val_loss"] for r in curve), default=None)}
