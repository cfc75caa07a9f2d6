"""What a multi-GPU model cell's job runs: one task that supervises the cell's ranks (one
process per GPU: flashwatt.distributed.rank_supervisor, rendezvous from
flashwatt.distributed.rendezvous), each of which builds the model, prepares it for the
cell's strategy (flashwatt.models.parallel), checks it against one process, times its
step, splits out the communication and the attention, and measures the energy of whole
steps on every GPU (`measure_on_rank`). Rank 0 returns the record's fields.

Every outcome is a record, as for one GPU: ok, incorrect, skipped (more GPUs than the
machine has, a strategy the model's heads cannot take, a backend with no
context-parallel form, ...), oom naming the stage and the rank, error with the traceback,
or job_failed for a rank that was killed; a rank that ends badly ends every rank of the
cell within the failure policy's bound (the record's `ranks` says how each ended).

Timing: `warmup_steps` untimed steps, then `timed_steps` steps, each started after a
barrier, with CUDA events around forward, backward, the gradient all-reduce (context
parallel) and the optimizer on every rank; per rank the median of each phase, and the
record's figure the slowest rank's (every rank's kept beside it). Communication: in
`comm_steps` profiled steps of their own, each after a barrier, each split inside its own
window, so that exposed communication is a share of the step it was measured in
(flashwatt.models.comm_timeline). Memory: each
GPU's peak. Energy: a window of whole steps over the NVML counters of every GPU of the
job, every rank running the same steps (flashwatt.distributed.energy_window); the energy
is summed over the GPUs and divided by the step's tokens over all of them.
"""
from __future__ import annotations

import os
import statistics

from flashwatt.job_frame import CellOutcome, Job, run_in_frame
from flashwatt.models.attention_share import attention_share
from flashwatt.models.cell import ModelCell
from flashwatt.models.preflight import why_not
from flashwatt.models.record_kind import KIND
from flashwatt.models.step_defaults import DEFAULT_STEPS, PARALLEL_STEPS


def available_gpus(nodes: int) -> int:
    import torch

    return torch.cuda.device_count() * nodes if torch.cuda.is_available() else 0


def why_not_parallel(cell: ModelCell, shape, device_type: str, gpus_here: int) -> str | None:
    """Why the multi-GPU cell cannot run here (before any process group starts), or None."""
    import torch

    from flashwatt.kernels.registry import block_refusal
    from flashwatt.models.cp_attention import BLOCK_OF_BACKEND, block_of
    from flashwatt.models.parallel_layout import CONTEXT_PARALLEL, ulysses_size

    if device_type == "cuda" and gpus_here < cell.gpus:
        return f"cell asks for {cell.gpus} GPUs; this machine has {gpus_here}"
    reason = why_not(cell, shape, torch.device(device_type))
    if reason is not None or cell.strategy not in CONTEXT_PARALLEL:
        return reason
    block = block_of(cell.backend)
    if block is None:
        return (f"{cell.backend} has no context-parallel form (the strategies compute with flashwatt's blocks: "
                f"{', '.join(BLOCK_OF_BACKEND)})")
    reason = block_refusal(block, cell.precision, device_type, shape.head_dim)
    if reason is not None:
        return reason
    split = ulysses_size(cell.strategy, cell.gpus)
    if split > 1 and shape.heads % split:
        return (f"strategy {cell.strategy}: its all-to-all over {split} ranks needs the query heads ({shape.heads}) "
                f"divisible by {split}")
    return None


def run_parallel_cell(cell: ModelCell, spec: dict, rank_job: str | None = None) -> CellOutcome | None:
    """Measure one multi-GPU cell: this job task supervises the cell's ranks
    (flashwatt.distributed.rank_supervisor), each running `measure_on_rank` (or `rank_job`,
    "module:function", a caller's wrapper of it); rank 0's record
    becomes the cell's. Never raises for a problem of the cell itself: a rank that ends
    badly ends every rank, and the record names it (oom with its stage, error, job_failed)."""
    from flashwatt.distributed import rendezvous

    rendezvous.multicast_off()

    def body(job: Job) -> list[dict]:
        import torch

        from flashwatt.distributed.cell_run import record_failed_ranks
        from flashwatt.distributed.rank_supervisor import run_ranks
        from flashwatt.models.presets import build_config, shape_of

        layout = rendezvous.node_layout(cell.gpus)
        job.rank_zero = layout.node == 0
        shape = shape_of(build_config(spec["model"]))
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        reason = why_not_parallel(cell, shape, device_type, available_gpus(layout.nodes))
        if reason is not None:
            job.skip(reason)
        outcome = run_ranks(rank_job or RANK_JOB, (cell, spec), layout)
        if outcome.failed:
            job.record["ranks"] = outcome.record_fields()
            record_failed_ranks(job.record, outcome)
            return []
        if outcome.result is None:
            raise RuntimeError("every rank ended cleanly but rank 0 returned no record")
        rank_record, trace = outcome.result
        job.record.update(rank_record)
        job.record["ranks"] = outcome.record_fields()
        return trace

    return run_in_frame(KIND, cell, spec, body)


RANK_JOB = "flashwatt.models.parallel_job:measure_on_rank"


def measure_on_rank(cell: ModelCell, spec: dict) -> tuple[dict, list[dict]] | None:
    """One rank of a multi-GPU cell (a process of its own, flashwatt.distributed.rank_process):
    (the record's fields, the energy trace) on rank 0, None on the others. An exception
    leaves with the stage it happened in (`flashwatt_stage`), for the record."""
    import torch.distributed as dist

    from flashwatt import measure
    from flashwatt.distributed import rendezvous
    from flashwatt.distributed.groups import forget_meshes
    from flashwatt.distributed.job import release_after_failure
    from flashwatt.job_frame import Stages
    from flashwatt.settings import MeasureSettings

    rendezvous.multicast_off()
    record: dict = {}
    stages = Stages(record, "rendezvous")
    rdv = rendezvous.from_environment()
    if rdv.world != cell.gpus:
        raise ValueError(f"model cell asks for {cell.gpus} GPUs but {rdv.world} processes were started "
                         "(one process per GPU)")
    try:
        device = rendezvous.start(rdv)
        record["environment"] = {k: os.environ.get(k) for k in rendezvous.MULTICAST_OFF}
        stages.enter("build")
        with measure.precision_mode(cell):
            trace = _measure(cell, spec, MeasureSettings.from_mapping(spec.get("measure", {})), device, record,
                             stages)
        stages.enter(None)
    except BaseException as err:
        err.flashwatt_stage = stages.now
        release_after_failure()
        raise
    dist.destroy_process_group()
    forget_meshes()
    return (record, trace) if rdv.rank == 0 else None


def _slowest(per_rank: list[dict], keys) -> dict:
    """Each key's largest value over the ranks, and every rank's."""
    out = {}
    for key in keys:
        values = [r[key] for r in per_rank if r.get(key) is not None]
        out[key] = max(values) if values else None
        out[f"per_rank_{key}"] = [r.get(key) for r in per_rank]
    return out


def _measure(cell: ModelCell, spec: dict, settings, device, record: dict, stage) -> list[dict]:
    """The cell on this rank, stage by stage (`stage` names the one running, for an
    out-of-memory record): build, prepare for the strategy, check, time, attention share,
    communication, energy. Returns the energy window's trace (rank 0's)."""
    import torch.distributed as dist

    from flashwatt.distributed.timing import barrier, gather
    from flashwatt.models.comm_timeline import communication_split
    from flashwatt.models.flops import step_utilisation
    from flashwatt.models.parallel_check import check_parallel
    from flashwatt.models.step import build_model, model_record, reference_factory

    steps = {**DEFAULT_STEPS, **PARALLEL_STEPS, **spec.get("steps", {})}
    seed = int(spec.get("seed", 0))
    train = cell.phase == "train"
    rank, world = dist.get_rank(), dist.get_world_size()
    uuid = _record_devices(device, rank, record)

    model = build_model(spec["model"], cell.precision, device, seed)
    shape, body, record["model"] = model_record(model, spec["model"])
    adapter, parallel = _prepare_for_strategy(cell, model, train, world, record)

    stage.enter("check")
    record["check"] = check_parallel(parallel, lambda: build_model(spec["model"], cell.precision, device, seed),
                                     lambda m: reference_factory(m, device), cell.precision, shape.vocab,
                                     shape.max_positions, train, seed)
    if parallel.attention is not None:
        record["parallel"]["block"] = parallel.attention.block_name
        record["parallel"]["kv_expanded"] = parallel.attention.kv_expanded

    step = _parallel_step(cell, parallel, model, shape, seed, device, train)
    if cell.governor:  # the job's steps under one budget instead of the timed steps and the energy window
        from flashwatt.models.governed_parallel import measure_governed_parallel

        trace = measure_governed_parallel(cell, spec, step, model, device, uuid, rank, record, stage)
        if record.get("status") is None:
            _set_status(record)
        return trace
    timing = _time_steps(cell, step, device, steps, rank, train, record, stage)
    record["flops"] = step_utilisation(
        shape, body, cell.global_batch, cell.seq_len, cell.phase, timing["step_ms"] / 1e3,
        (record.get("device") or {}).get("name") if rank == 0 else None, cell.precision, gpus=world)

    stage.enter("attention steps")
    record["attention"] = _attention_share_of_ranks(step, model, cell, device, int(steps["attention_steps"]))
    if adapter is not None:
        record["attention"]["kv_expanded"] = adapter.kv_expanded

    stage.enter("communication steps")
    comm = gather(communication_split(step.run, device, int(steps["comm_steps"]), before=lambda: barrier(device)))
    record["communication"] = _communication(comm, timing)

    stage.enter("energy window")
    trace = _energy(cell, step, device, settings, timing, uuid, rank, record)
    _set_status(record)
    return trace


def _record_devices(device, rank: int, record: dict) -> str | None:
    """Rank 0's device identity and every rank's device in the record; this rank's GPU UUID."""
    from flashwatt.distributed.energy_window import device_of
    from flashwatt.distributed.timing import gather
    from flashwatt.job_frame import device_identity
    from flashwatt.telemetry import NullTelemetry, open_telemetry

    uuid = device_of(device).get("uuid")
    if rank == 0:
        telemetry = open_telemetry([uuid]) if uuid else NullTelemetry("no CUDA device")
        record["device"] = device_identity(device, telemetry)
        telemetry.close()
    else:
        record["device"] = None
    record["devices"] = gather(device_of(device))
    return uuid


def _prepare_for_strategy(cell: ModelCell, model, train: bool, world: int, record: dict):
    """The model sharded (fsdp, on the cell's backend) or switched to context-parallel
    attention: (the backend's adapter or None, the Parallel). The layout goes into the record."""
    from flashwatt.models.attention import use_backend
    from flashwatt.models.cp_attention import block_of
    from flashwatt.models.parallel import prepare

    adapter = use_backend(model, cell.backend, cell.precision, train) if cell.strategy == "fsdp" else None
    parallel = prepare(model, cell.strategy, block=block_of(cell.backend) or "auto",
                       recompute=cell.recompute if train else 0)
    if cell.strategy == "fsdp":
        batch = {"batch_per_gpu": cell.batch,
                 "batch_meaning": "data parallel: each GPU its own batch sequences, global batch = batch x gpus"}
    else:
        batch = {"batch": cell.batch,
                 "batch_meaning": "context parallel: batch sequences, each split over every GPU (global batch = "
                                  "batch)"}
    record["parallel"] = {
        "strategy": cell.strategy, "world_size": world, **batch, "global_batch": cell.global_batch,
        "tokens_per_step": cell.tokens,
        "loss": "mean next-token cross-entropy over every token of every rank (labels shifted on the global "
                "sequence)", **parallel.details}
    return adapter, parallel


def _parallel_step(cell: ModelCell, parallel, model, shape, seed: int, device, train: bool):
    """The step over the global batch of random tokens, with AdamW (fused) when it trains."""
    import torch

    from flashwatt.models.parallel_step import ParallelStep
    from flashwatt.models.step import random_tokens

    tokens = random_tokens(shape.vocab, cell.global_batch, cell.seq_len, seed + 1, device)
    optimizer = None
    if train:
        model.train()
        # Fused on CPU too: the tests then run the optimizer path a GPU runs (fused over DTensor shards).
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=True)
    else:
        model.eval()
    return ParallelStep(parallel, tokens, cell.phase, optimizer)


def _time_steps(cell: ModelCell, step, device, steps: dict, rank: int, train: bool, record: dict, stage) -> dict:
    """Warm-up, then timed steps on every rank: the slowest rank's median per phase (every
    rank's beside it), and each GPU's peak memory. Returns the timing it records."""
    from flashwatt.distributed.timing import gather
    from flashwatt.models.recompute import checkpointed_blocks
    from flashwatt.models.step import time_steps, warm_up

    stage.enter("warm-up")
    warm = warm_up(step, device, int(steps["warmup_steps"]))

    stage.enter("timed steps")
    mine = time_steps(step, device, int(steps["timed_steps"]))
    per_rank = gather(mine)
    timing = _slowest(per_rank, [f"{part}_ms" for part in (*step.parts, "step")])
    timing["steps_ms"] = mine["steps_ms"] if rank == 0 else None
    timing["method"] = mine["method"] + "; every step after a barrier; the slowest rank's median per phase"
    timing["warmup_s"] = warm
    timing["tokens_per_s"] = cell.tokens / (timing["step_ms"] / 1e3)
    record["timing"] = timing
    record["memory"] = _memory(device, gather(_peaks(device)))
    if train:
        record["memory"]["optimizer"] = (f"AdamW (fused), states in {cell.precision}"
                                         + (", sharded like the weights" if cell.strategy == "fsdp" else ""))
    record["memory"]["recompute"] = cell.recompute  # percent of the decoder blocks
    record["memory"]["recomputed_blocks"] = checkpointed_blocks(step.model)
    return timing


def _attention_share_of_ranks(step, model, cell: ModelCell, device, count: int) -> dict:
    """Rank 0's attention share, with every rank's share beside it where it was measured."""
    from flashwatt.distributed.timing import gather

    share = attention_share(step, model, cell, device, count)
    shares = gather(share)
    return shares[0] | ({"per_rank_share": [s.get("share") for s in shares]} if share.get("method") else {})


def _energy(cell: ModelCell, step, device, settings, timing: dict, uuid: str | None, rank: int,
            record: dict) -> list[dict]:
    """The energy window of whole steps over every GPU of the job (rank 0 records it, per
    token); returns its power trace."""
    import torch

    from flashwatt.distributed.energy_window import job_energy

    energy, trace = job_energy(step.run, lambda: torch.cuda.synchronize(device), settings,
                               timing["step_ms"] / 1e3, uuid)
    if rank == 0:
        if energy.get("available"):
            energy["unit"] = "one call = one step on every GPU"
            energy["summed_over"] = f"{energy['n_gpus']} GPUs (per_gpu holds each)"
            if energy["energy_per_call_j"] is not None:
                energy["j_per_token"] = energy["energy_per_call_j"] / cell.tokens
                energy["tokens_per_j"] = cell.tokens / energy["energy_per_call_j"]
            if energy["time_per_call_s"]:
                energy["window_tokens_per_s"] = cell.tokens / energy["time_per_call_s"]
        record["energy"] = energy
    return trace


def _set_status(record: dict) -> None:
    """ok, or incorrect naming each part of the check that failed and by how much."""
    check = record["check"]
    record["status"] = "ok" if check["passed"] else "incorrect"
    if not check["passed"]:
        failed = [k for k in ("logits", "causal", "grad") if k in check and not check[k]["passed"]]
        record["reason"] = "parallel model check failed: " + ", ".join(
            f"{k} {check[k].get('error', check[k].get('prefix_change')):.3g}" for k in failed)


def _peaks(device) -> dict:
    import torch

    if device.type != "cuda":
        return {}
    return {"allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device),
            "total": torch.cuda.get_device_properties(device).total_memory}


def _memory(device, peaks: list[dict]) -> dict:
    if device.type != "cuda":
        return {}
    return {"peak_allocated_bytes": max(p["allocated"] for p in peaks),
            "peak_reserved_bytes": max(p["reserved"] for p in peaks),
            "device_total_bytes": peaks[0]["total"],
            "per_gpu_peak_allocated_bytes": [p["allocated"] for p in peaks],
            "per_gpu_peak_reserved_bytes": [p["reserved"] for p in peaks],
            "peak_of": "the GPU with the largest peak (per_gpu_* holds each)"}


def _communication(per_rank: list[dict], timing: dict) -> dict:
    """Every rank's split, and the figures of the rank with the largest share of its own
    profiled step exposed. Each rank's figures come from its own profiled steps, so the
    exposed share is of the step it was measured in (at most 1); `profiled_over_timed_step`
    says how far those steps ran from the timed ones."""
    if not per_rank[0].get("method"):
        return per_rank[0]
    worst = max(per_rank, key=lambda r: (r["exposed_share_of_step"] or 0.0, r["exposed_ms"]))
    out = {k: worst[k] for k in ("method", "exposed_method", "steps", "step_ms", "communication_ms", "exposed_ms",
                                 "hidden_ms", "hidden_fraction", "exposed_share_of_step", "by_kind_ms",
                                 "collective_spans")}
    out["rank"] = per_rank.index(worst)
    out["per_rank"] = [{k: r[k] for k in ("step_ms", "communication_ms", "exposed_ms", "hidden_ms",
                                          "exposed_share_of_step")} for r in per_rank]
    out["median_exposed_ms"] = statistics.median(r["exposed_ms"] for r in per_rank)
    if timing.get("step_ms") and worst["step_ms"]:
        out["profiled_over_timed_step"] = worst["step_ms"] / timing["step_ms"]
    return out
