"""One distributed attention cell, run on every rank; rank 0 returns the record.

spec keys: strategy (ring|zigzag|ulysses|hybrid), gpus (world size), batch, heads,
kv_heads, seq_len (L, whole sequence), head_dim, precision (fp32|tf32|fp16|bf16; fp64
for CPU checks), causal, pass (fwd|fwd_bwd), block (auto|flash|efficient|cudnn|custom|
math). Optional: seed (0), repeats (10), warmup (3), ulysses_size (hybrid; default the
processes per node), single_gpu (True: time the whole problem on one GPU in the same
run), context_parallel (True: time PyTorch's context_parallel as the peer), variant
(custom kernel launch variant), check (True), measure (flashwatt.settings.MeasureSettings
keys: the energy window's settings).

Check: batch 0 and the query heads of the first K/V head group (two groups for MHA) of
the gathered output and gradients, every row, against `reference.reference_group` in
float64. The same slice, on one GPU through the same block backend (a ring of one),
gives the single-GPU error; the distributed result must be within twice it.

Timing: every timed call starts after a barrier; CUDA events on each rank (perf_counter
on CPU); per rank the median; the record keeps every rank's median and the slowest.
Communication: the forward and the backward are timed three ways (split_mode): full,
compute only (every block, no transfer) and communication only (every transfer, no
block); exposed communication = full - compute only, hidden = comm only - exposed.

Energy (measure.energy): a window of whole calls (forward, and backward for fwd_bwd) run
in lockstep on every rank, each GPU's NVML counter read between its own updates and the
energy summed over the job's GPUs (flashwatt.distributed.energy_window); then the whole
problem on rank 0's GPU alone, its own window, for energy_ratio_to_one_gpu. The power
trace of the job's window is the record's `trace` (the cell's trace file).
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from flashwatt.distributed import rendezvous
from flashwatt.distributed.api import attention
from flashwatt.distributed.blocks import get_block
from flashwatt.distributed.context_parallel_peer import context_parallel_peer
from flashwatt.distributed.energy_window import device_of, job_energy
from flashwatt.energy import gflops_per_watt
from flashwatt.flop_count import attention_flops
from flashwatt.distributed.groups import forget_meshes, resolve
from flashwatt.distributed.cell import refusal_without_cuda
from flashwatt.distributed.inputs import DTYPES, make_full
from flashwatt.distributed.layout import gather_sequence, shard_sequence
from flashwatt.distributed.rank_zero import from_rank_zero
from flashwatt.distributed.ring import RingAttention
from flashwatt.distributed.split_mode import split_mode
from flashwatt.distributed.timing import barrier, gather, median_ms, sync
from flashwatt.measure import relative_error
from flashwatt.settings import MeasureSettings

REQUIRED = ("strategy", "gpus", "batch", "heads", "kv_heads", "seq_len", "head_dim", "precision", "causal", "pass",
            "block")
COMM_METHOD = ("forward and backward each timed in three runs of the same schedule: full; compute only (every "
               "block, no transfer); communication only (every transfer, no block). exposed_ms = full - "
               "compute_only; hidden_ms = comm_only - exposed (clamped at 0); hidden_fraction = hidden_ms / "
               "comm_only_ms. Medians per rank, the slowest rank's reported.")


def check_spec(spec: dict) -> None:
    missing = [key for key in REQUIRED if key not in spec]
    if missing:
        raise ValueError(f"distributed job spec lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    if spec["precision"] not in DTYPES:
        raise ValueError(f"distributed job: precision {spec['precision']!r} not in {', '.join(DTYPES)}")
    if spec["pass"] not in ("fwd", "fwd_bwd"):
        raise ValueError(f"distributed job: pass {spec['pass']!r} not in fwd, fwd_bwd")


def flops(spec: dict) -> float:
    """Useful flops of the whole problem (flashwatt.flop_count: causal half, fwd_bwd 3.5 forwards)."""
    return attention_flops(spec["batch"], spec["heads"], spec["seq_len"], spec["head_dim"], spec["causal"],
                           spec["pass"])


def _skip(spec: dict, reason: str) -> dict:
    return {"status": "skipped", "reason": reason, "spec": spec}


def _available_gpus(rdv) -> int:
    return torch.cuda.device_count() * rdv.nodes if torch.cuda.is_available() else 0


def job(spec: dict, rank: int | None = None, world: int | None = None, local_rank: int | None = None,
        addr: str | None = None, port: int | None = None) -> dict | None:
    """Run the cell on this rank; the record on rank 0, None elsewhere."""
    rendezvous.multicast_off()
    check_spec(spec)
    rdv = rendezvous.from_environment(rank, world, local_rank, addr, port)
    wanted = int(spec["gpus"])
    if torch.cuda.is_available():
        have = _available_gpus(rdv)
        if have < wanted:
            return _skip(spec, f"cell asks for {wanted} GPUs; this machine has {have}") if rdv.rank == 0 else None
    elif refusal_without_cuda(spec["precision"]) is not None:
        return _skip(spec, refusal_without_cuda(spec["precision"])) if rdv.rank == 0 else None
    if rdv.world != wanted:
        raise ValueError(f"distributed job: cell asks for {wanted} GPUs but {rdv.world} processes were started "
                         "(one process per GPU)")
    device = rendezvous.start(rdv)
    try:
        record = _run(spec, rdv, device)
    except BaseException:
        # A failure of this rank reaches the caller as itself: the rank supervisor (or
        # torchrun) sees this process end badly and stops the others, which may be waiting
        # in a collective for this rank. No closing barrier: they may never join it.
        release_after_failure()
        raise
    dist.barrier()
    dist.destroy_process_group()
    forget_meshes()
    return record if rdv.rank == 0 else None


def release_after_failure() -> None:
    """Let go of the default process group without waiting on peers: NCCL's is aborted (its
    destroy could wait for collectives that will never complete), gloo's destroyed."""
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "nccl" and hasattr(dist.distributed_c10d, "_abort_process_group"):
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()
    finally:
        forget_meshes()


def _run(spec: dict, rdv, device) -> dict:
    dtype = DTYPES[spec["precision"]]
    tf32 = spec["precision"] == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    strategy, causal, bwd = spec["strategy"], bool(spec["causal"]), spec["pass"] == "fwd_bwd"
    group = None
    if strategy == "hybrid" and spec.get("ulysses_size"):
        from flashwatt.distributed.groups import default_mesh

        group = default_mesh(int(spec["ulysses_size"]))
    coords = resolve(strategy, group)
    block_name = spec["block"]
    repeats, warmup = int(spec.get("repeats", 10)), int(spec.get("warmup", 3))
    q, k, v, dout = make_full(spec, device, dtype)
    if block_name == "custom":
        from flashwatt.kernels.blocks import CustomBlock

        block = CustomBlock(spec.get("variant", ""))
    else:
        block = get_block(block_name, q)
    ql, kl, vl, dl = (shard_sequence(t, strategy, group) for t in (q, k, v, dout))
    del q, k, v, dout
    for t in (ql, kl, vl):
        t.requires_grad_(bwd)

    def run_forward(_=None):
        with torch.set_grad_enabled(bwd):
            return attention(ql, kl, vl, causal=causal, strategy=strategy, block=block, group=group)

    def run_backward(out):
        torch.autograd.backward(out, dl)

    def step():
        out = run_forward()
        if bwd:
            run_backward(out)

    # Correctness first (a wrong answer is not timed as if it were right).
    out = run_forward()
    if bwd:
        run_backward(out)
    record = {"status": "ok", "spec": spec, "world_size": rdv.world, "nodes": rdv.nodes, "strategy": strategy,
              "block": getattr(block, "name", str(block_name)), "device": _device_name(device),
              "environment": {k: os.environ.get(k) for k in rendezvous.MULTICAST_OFF}}
    if spec.get("check", True):
        record["check"] = _check(spec, coords, group, block, out, (ql, kl, vl), dtype, device, bwd)
    for t in (ql, kl, vl):
        t.grad = None
    del out

    # Peak memory of one step, per GPU.
    if device.type == "cuda":
        barrier(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        record["memory"] = {"peak_bytes_per_gpu": gather(int(torch.cuda.max_memory_allocated(device)))}

    timing = {}
    comm = {"method": COMM_METHOD}
    for mode in ("full", "compute_only", "comm_only"):
        with split_mode(mode):
            fwd_ms = median_ms(run_forward, device, repeats, warmup)
            bwd_ms = median_ms(run_backward, device, repeats, warmup, before=run_forward) if bwd else None
        timing[mode] = {"forward": gather(fwd_ms), "backward": gather(bwd_ms) if bwd else None}
    for phase in ("forward", "backward") if bwd else ("forward",):
        full, compute, only = (max(timing[m][phase]) for m in ("full", "compute_only", "comm_only"))
        exposed = max(0.0, full - compute)
        hidden = max(0.0, only - exposed)
        comm[phase] = {"full_ms": full, "compute_only_ms": compute, "comm_only_ms": only, "exposed_ms": exposed,
                       "hidden_ms": hidden, "hidden_fraction": hidden / only if only > 0 else None,
                       "per_rank_full_ms": timing["full"][phase]}
    total_ms = comm["forward"]["full_ms"] + (comm["backward"]["full_ms"] if bwd else 0.0)
    record["time"] = {"forward_ms": comm["forward"]["full_ms"],
                      "backward_ms": comm["backward"]["full_ms"] if bwd else None, "total_ms": total_ms,
                      "method": "cuda_events" if device.type == "cuda" else "perf_counter"}
    record["communication"] = comm
    tf = flops(spec) / (total_ms * 1e-3) / 1e12
    record["tflops"] = {"total": tf, "per_gpu": tf / rdv.world, "flops": flops(spec)}
    settings = MeasureSettings.from_mapping(spec.get("measure", {}))
    record["energy"], record["trace"] = _job_energy(step, spec, device, settings, record["tflops"]["flops"],
                                                    total_ms / 1e3)
    if spec.get("single_gpu", True):
        record["single_gpu"] = _single_gpu(spec, block, device, dtype, bwd, causal, repeats, warmup, settings)
        one = record["single_gpu"]
        if one.get("total_ms"):
            record["speedup"] = one["total_ms"] / total_ms
            record["efficiency"] = record["speedup"] / rdv.world
            mine, alone = record["energy"].get("energy_per_call_j"), (one.get("energy") or {}).get("energy_per_call_j")
            if mine and alone:
                record["energy_ratio_to_one_gpu"] = mine / alone
            if one.get("peak_bytes") and record.get("memory"):
                record["memory"]["ratio_to_one_gpu"] = max(record["memory"]["peak_bytes_per_gpu"]) / one["peak_bytes"]
    if spec.get("context_parallel", True):
        record["context_parallel"] = context_parallel_peer(spec, device, dtype, bwd, causal, repeats, warmup,
                                                           getattr(block, "name", None))
    return record


def _device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _check(spec, coords, group, block, out, leaves, dtype, device, bwd) -> dict:
    """Errors of output (and dQ, dK, dV) against float64 on the gathered sequence, and the
    same backend's single-GPU errors on the same slice."""
    strategy = spec["strategy"]
    H, Hkv = spec["heads"], spec["kv_heads"]
    G = H // Hkv
    kv_heads = min(Hkv, 2) if G == 1 else 1
    qh = kv_heads * G
    gathered = [gather_sequence(out.detach()[:1, :qh].contiguous(), strategy, group)]
    if bwd:
        ql, kl, vl = leaves
        gathered += [gather_sequence(t.grad[:1, :n].contiguous(), strategy, group)
                     for t, n in ((ql, qh), (kl, kv_heads), (vl, kv_heads))]
    result = None
    if dist.get_rank() == 0:
        q, k, v, dout = (t[:1] for t in make_full(spec, device, dtype))
        q, k, v, dout = q[:, :qh], k[:, :kv_heads], v[:, :kv_heads], dout[:, :qh]
        pieces = [reference_slice(q, k, v, dout if bwd else None, spec["causal"], g, G) for g in range(kv_heads)]
        ref = [torch.cat([p[i] for p in pieces], dim=1) if pieces[0][i] is not None else None for i in range(4)]
        # The same backend on one GPU, the whole sequence (a ring of one: no communication).
        q1, k1, v1 = (t.clone().requires_grad_(bwd) for t in (q, k, v))
        with torch.set_grad_enabled(bwd):
            out1 = RingAttention.apply(q1, k1, v1, bool(spec["causal"]), 1.0 / math.sqrt(spec["head_dim"]), None,
                                       "contiguous", block)
        single = [out1.detach()]
        if bwd:
            single += list(torch.autograd.grad(out1, (q1, k1, v1), dout))
        names = ["out", "dq", "dk", "dv"][:len(gathered)]
        dist_err = {n: relative_error(g[0], r[0]) for n, g, r in zip(names, gathered, ref)}
        one_err = {n: relative_error(s[0], r[0]) for n, s, r in zip(names, single, ref)}
        floor = 1e-13 if dtype == torch.float64 else 0.0  # float64: both errors are rounding noise
        tol = {n: max(2.0 * one_err[n], floor) for n in names}
        result = {"rows_checked": spec["seq_len"], "batch_checked": 1, "q_heads_checked": qh,
                  "kv_heads_checked": kv_heads, "error": dist_err, "single_gpu_error": one_err,
                  "tolerance": tol, "tolerance_rule": "2 x the same block backend's single-GPU error on the same data",
                  "passed": all(dist_err[n] <= tol[n] for n in names)}
    return from_rank_zero(result)


def reference_slice(q, k, v, dout, causal, g, G):
    """float64 (out, dq, dk, dv) of K/V head g and its G query heads, shaped (1, heads, L, D)."""
    from flashwatt.distributed.reference import reference_group

    qs = slice(g * G, (g + 1) * G)
    res = reference_group(q[0, qs], k[0, g], v[0, g], None if dout is None else dout[0, qs], causal)
    shapes = [(1, G), (1, G), (1, 1), (1, 1)]
    return [None if r is None else r.reshape(s + r.shape[-2:]) for r, s in zip(res, shapes)]


def tokens(spec: dict) -> int:
    return int(spec["batch"]) * int(spec["seq_len"])


def _energy_entry(energy: dict, spec: dict, flops_per_call: float, summed_over: str) -> dict:
    energy["unit"] = "one call = " + ("forward and backward" if spec["pass"] == "fwd_bwd" else "forward") + \
        " of the whole problem"
    energy["summed_over"] = summed_over
    if energy.get("energy_per_call_j"):
        energy["j_per_token"] = energy["energy_per_call_j"] / tokens(spec)
        energy["gflops_per_j"] = gflops_per_watt(flops_per_call, energy["energy_per_call_j"])
    return energy


def _job_energy(step, spec: dict, device, settings, flops_per_call: float, step_s: float) -> tuple[dict, list[dict]]:
    """Energy of whole calls summed over every GPU of the job, each GPU between its own
    counter updates (flashwatt.distributed.energy_window), and the power trace (rank 0)."""
    energy, trace = job_energy(step, lambda: sync(device), settings, step_s, device_of(device).get("uuid"))
    if not energy.get("available"):
        return energy, []
    return _energy_entry(energy, spec, flops_per_call, f"{energy['n_gpus']} GPUs (per_gpu holds each)"), trace


def _single_gpu_energy(step, spec: dict, device, settings, flops_per_call: float) -> dict:
    """Energy of the whole problem on rank 0's GPU alone (the other GPUs wait, not measured)."""
    from flashwatt.energy import measure_energy
    from flashwatt.telemetry import open_telemetry

    if device.type != "cuda" or not settings.energy:
        return {"reason": "no CUDA device" if device.type != "cuda" else "measure.energy: false"}
    telemetry = open_telemetry([device_of(device)["uuid"]])
    try:
        if not telemetry.available:
            return {"reason": telemetry.reason}
        window = measure_energy(step, lambda: torch.cuda.synchronize(device), telemetry,
                                **settings.energy_window())
    finally:
        telemetry.close()
    return _energy_entry(window.as_dict(), spec, flops_per_call, "1 GPU")


def _single_gpu(spec, block, device, dtype, bwd, causal, repeats, warmup, settings) -> dict:
    """The whole problem on rank 0's device through the same block backend (no communication)."""
    result = None
    if dist.get_rank() == 0:
        try:
            q, k, v, dout = make_full(spec, device, dtype)
            for t in (q, k, v):
                t.requires_grad_(bwd)
            scale = 1.0 / math.sqrt(spec["head_dim"])

            def fwd(_=None):
                with torch.set_grad_enabled(bwd):
                    return RingAttention.apply(q, k, v, causal, scale, None, "contiguous", block)

            def bwd_call(out):
                torch.autograd.backward(out, dout)

            peak = None
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                o = fwd()
                if bwd:
                    bwd_call(o)
                del o
                sync(device)
                peak = int(torch.cuda.max_memory_allocated(device))
            f_ms = median_ms(fwd, device, repeats, warmup, together=False)
            b_ms = median_ms(bwd_call, device, repeats, warmup, before=fwd, together=False) if bwd else 0.0
            result = {"forward_ms": f_ms, "backward_ms": b_ms if bwd else None, "total_ms": f_ms + b_ms,
                      "peak_bytes": peak}

            def step():
                o = fwd()
                if bwd:
                    bwd_call(o)

            try:
                result["energy"] = _single_gpu_energy(step, spec, device, settings, flops(spec))
            except Exception as err:  # the timing above stands without it
                result["energy"] = {"reason": f"{type(err).__name__}: {err}"}
        except Exception as err:
            result = {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
    return from_rank_zero(result)


def main(argv: list[str] | None = None) -> int:
    """`torchrun --nproc-per-node N -m flashwatt.distributed.job SPEC_JSON [RECORD.json]`: run one
    cell by hand (SPEC_JSON a JSON object or @file); rank 0 prints the record (and writes it)."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__, file=sys.stderr)
        return 2
    text = open(args[0][1:]).read() if args[0].startswith("@") else args[0]
    record = job(json.loads(text))
    if record is not None:
        out = json.dumps({k: v for k, v in record.items() if k != "trace"}, indent=1, default=str)
        print(out)
        if len(args) > 1:
            with open(args[1], "w") as fh:
                fh.write(out)
        return 0 if record["status"] != "failed" and record.get("check", {}).get("passed", True) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
