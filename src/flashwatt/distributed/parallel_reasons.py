"""Why a multi-GPU cell scaled as it did, in one sentence built from its own measured fields
(docs/parallel.md, written by flashwatt.distributed.parallel_tables).

An attention cell (a row of the distributed table) is compared with the same problem on one
GPU in the same job: its ideal time is that one-GPU time over the GPUs. What keeps it from
the ideal is named from the measurements:

- communication left exposed (forward + backward, the split of flashwatt.distributed.split_mode);
- load imbalance, where the layout has one: the contiguous ring under a causal mask gives
  its last rank (W - 1/2) blocks of the W/2 a balanced rank computes, which caps the
  speedup at W^2 / (2W - 1);
- the blocks themselves running slower per unit of work than on one GPU (the compute time,
  call minus exposed communication, over its share of the one-GPU time, imbalance taken
  out), with the query tiles of 128 rows each rank has: too few tiles per rank to fill a
  GPU where they are fewer than FEW_TILES.

A model cell (a row of the models table) is compared with the same model, backend and step
on one GPU: FSDP gives each GPU its own sequences, so its ideal step is the one-GPU step;
context parallelism splits the same sequences, so its ideal is the one-GPU step over the
GPUs. The gap is split into exposed communication (the profiled share of the step), the
optimizer every GPU runs whole under context parallelism, and the rest: compute that did
not shrink with the GPUs. Memory says whether the weights were sharded (FSDP) or
replicated (context parallelism: every GPU holds the whole model, its gradients and its
optimizer states).
"""
from __future__ import annotations

import math
import re

TILE_ROWS = 128
FEW_TILES = 1024       # a few waves of a 132-SM GPU's worth of 128-row tiles
SLOWER_BLOCKS = 1.15   # compute per unit of work this much above one GPU's is called out
EXPOSED_SHARE = 0.10   # exposed communication above this share of the call is called out
SCALES = 0.90          # efficiency from which a cell "scales"
REPLICATED = 0.5       # peak memory per GPU above this share of one GPU's: the model is whole on each
REASON_CHARS = 90      # a failed cell's reason in a table row: its first clause, at most this long


def _num(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def ring_causal_cap(world: int) -> float:
    """The largest speedup a contiguous ring under a causal mask can reach on `world` ranks."""
    return world ** 2 / (2 * world - 1)


def _imbalance(row) -> tuple[float, str | None]:
    """(the busiest rank's work over the mean, a sentence), 1 where the layout is balanced."""
    world = int(row["gpus"])
    if row["strategy"] == "ring" and bool(row["causal"]) and world > 1:
        busiest = (2 * world - 1) / world
        return busiest, (f"the contiguous ring under a causal mask gives its last rank {busiest:.2f}x the mean work, "
                         f"capping the speedup at {ring_causal_cap(world):.2f}x")
    return 1.0, None


def _slow_blocks(row, compute_ms: float, ideal_ms: float, busiest: float) -> str | None:
    world = int(row["gpus"])
    slower = compute_ms / (ideal_ms * busiest)
    if slower <= SLOWER_BLOCKS:
        return None
    rows = int(row["seq_len"]) // world
    tiles = int(row["batch"]) * int(row["heads"]) * math.ceil(rows / TILE_ROWS)
    text = (f"the blocks take {slower:.2f}x their share of the one-GPU time ({tiles} query tiles of {TILE_ROWS} rows "
            f"per rank: {rows} rows x {int(row['heads'])} heads x {int(row['batch'])})")
    return text + (": too few tiles per rank to fill a GPU" if tiles < FEW_TILES else "")


def failed_reason(row) -> str:
    """A cell that did not end ok, in the table: its status and the first clause of its reason
    (an exception's message runs to hundreds of characters; the whole reason is in the list
    of cells that did not end ok, below the tables)."""
    reason = str(row.get("reason") or "no reason recorded")
    clause = re.split(r"(?<=[.;:])\s", reason, maxsplit=1)[0].rstrip(".;:")
    if len(clause) > REASON_CHARS:
        clause = clause[:REASON_CHARS].rsplit(" ", 1)[0] + " ..."
    return f"{row.get('status')}: {clause} (whole reason below)"


def attention_reason(row) -> str:
    """Why this distributed cell reached its speedup (module docstring)."""
    if row.get("status") != "ok":
        return failed_reason(row)
    total, single = _num(row.get("total_ms")), _num(row.get("single_gpu_total_ms"))
    if not total or not single:
        return "no one-GPU time in the same job to compare with"
    world = int(row["gpus"])
    exposed = (_num(row.get("forward_comm_exposed_ms")) or 0.0) + (_num(row.get("backward_comm_exposed_ms")) or 0.0)
    ideal, efficiency = single / world, single / total / world
    busiest, imbalance = _imbalance(row)
    parts = [p for p in (imbalance, _slow_blocks(row, max(total - exposed, 0.0), ideal, busiest)) if p]
    if exposed / total > EXPOSED_SHARE:
        parts.append(f"{exposed:.1f} ms of communication left exposed ({exposed / total:.0%} of the call)")
    if not parts:
        tflops = _num(row.get("tflops_per_gpu"))
        head = "scales" if efficiency >= SCALES else f"{efficiency:.0%} of linear with no single cause above the thresholds"
        parts.append(f"{head}: {exposed:.1f} ms ({exposed / total:.1%}) of communication exposed"
                     + (f", blocks at {tflops:.0f} TFLOP/s per GPU" if tflops else ""))
    energy = _num(row.get("energy_ratio_to_one_gpu"))
    if energy is not None and energy > 1.1:
        parts.append(f"{energy:.2f}x one GPU's energy per call for {1 / efficiency:.2f}x its GPU-time")
    return "; ".join(parts) + "."


def _gap_parts(row, one, ideal_ms: float, context_parallel: bool) -> list[tuple[float, str]]:
    step = float(row["step_ms"])
    share = _num(row.get("exposed_share_of_step"))
    exposed = share * step if share is not None else 0.0
    parts = []
    if share is not None:
        sync = _num(row.get("grad_sync_ms"))
        among = f", the gradient all-reduce's {sync:.0f} ms among it" if context_parallel and sync else ""
        parts.append((exposed, f"{exposed:.0f} ms exposed communication{among}"))
    optimizer_extra = 0.0
    if context_parallel and _num(row.get("optimizer_ms")) is not None and _num(one.get("optimizer_ms")) is not None:
        world = int(row["gpus"])
        optimizer_extra = max(0.0, float(row["optimizer_ms"]) - float(one["optimizer_ms"]) / world)
        parts.append((optimizer_extra, f"{optimizer_extra:.0f} ms of the whole optimizer on every GPU"))
    rest = step - ideal_ms - exposed - optimizer_extra
    if rest > 0:
        parts.append((rest, f"{rest:.0f} ms of compute that did not shrink with the GPUs"))
    return sorted((p for p in parts if p[0] > 0.5), key=lambda p: -p[0])


def _memory(row, one, context_parallel: bool) -> str | None:
    mine, alone = _num(row.get("peak_allocated_bytes")), _num(one.get("peak_allocated_bytes"))
    if not mine or not alone:
        return None
    ratio = mine / alone
    if context_parallel:
        if ratio > REPLICATED:
            return f"weights replicated under CP: peak {ratio:.2f}x one GPU's per GPU (the model, its gradients and optimizer whole on each)"
        return f"peak {ratio:.2f}x one GPU's per GPU"
    return f"weights sharded: peak {ratio:.2f}x one GPU's per GPU"


def model_reason(row, one) -> str:
    """Why this multi-GPU model cell reached its speedup over `one` (the same step's one-GPU
    row, or None) (module docstring)."""
    if row.get("status") != "ok":
        return failed_reason(row)
    if one is None or not _num(one.get("step_ms")) or not _num(row.get("step_ms")):
        return "no one-GPU cell of the same step to compare with"
    world = int(row["gpus"])
    context_parallel = row["strategy"] != "fsdp"
    ideal = float(one["step_ms"]) / (world if context_parallel else 1)
    efficiency = ideal / float(row["step_ms"])
    what = f"one GPU's step over {world}" if context_parallel else "one GPU's step (each GPU its own sequences)"
    parts = _gap_parts(row, one, ideal, context_parallel)
    if efficiency >= SCALES or not parts:
        head = f"{efficiency:.0%} of linear (ideal: {what}, {ideal:.0f} ms)"
    else:
        head = (f"{efficiency:.0%} of linear: the step is {float(row['step_ms']) - ideal:.0f} ms over its ideal ({what}, "
                f"{ideal:.0f} ms): " + ", ".join(text for _, text in parts))
    memory = _memory(row, one, context_parallel)
    return head + (f"; {memory}" if memory else "") + "."
