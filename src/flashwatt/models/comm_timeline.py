"""How much of a multi-GPU step is communication, and how much of that is hidden under
compute, read from the profiler's timeline of steps of their own.

`communication_split(run, device, count, before)` runs `count` steps, each after
`before()` (a barrier: every rank starts the step together, as in the timed steps) and
each under a torch.profiler of its own, and splits each step's timeline inside that
step's own window:

- window: from the first to the last event of the step on the device that runs it (GPU
  kernels and copies on a GPU; every operator on CPU). Every span below is cut to it, so
  no figure of a step can exceed the step.
- communication: the union of the collectives' spans. On a GPU, every NCCL kernel (FSDP's
  all-gathers and reduce-scatters, the ring's send/receive, Ulysses' all-to-all, the
  gradient all-reduce). An NCCL kernel starts when its stream reaches it and ends when
  every rank has taken part, so a rank's wait for a slower one counts as communication.
  On CPU (gloo processes), the spans of gloo's work (`gloo:*` events).
- exposed: the part of the communication during which no compute ran (no other GPU
  kernel or copy; on CPU no other innermost operator on any thread): time the step
  spent on communication alone.
- hidden: communication minus exposed, the part overlapped by compute.

Every figure is per step (the totals over `count` steps, divided by `count`);
`exposed_share_of_step` is the exposed time over the windows' time, so it lies in [0, 1]
by construction. `by_kind_ms` sums each collective kind's own spans (they may overlap one
another, so they can add up to more than the union).

On a GPU only device activity is profiled (CUPTI): recording every CPU operator as well
slows a launch-bound step by half or more, and the GPU then idles between launches while
an NCCL kernel already launched waits for a slower rank, which the split would count as
exposed communication of a step the timed steps never ran. Even so the profiled step is
not the timed one: `step_ms` is the profiled step's own window, and the multi-GPU record
puts it beside the timed step (flashwatt.models.parallel_job) so that the difference shows.
"""
from __future__ import annotations

import re

import torch

METHOD = ("torch.profiler timeline of steps of their own, each after a barrier and each split inside its own "
          "window (first to last event of the step on its device): communication = union of the collectives' "
          "spans (NCCL kernels on a GPU, which include waiting for the other ranks; gloo work spans on CPU); "
          "exposed = the part of it with no compute running (no other GPU kernel or copy; on CPU no other "
          "innermost operator); hidden = communication - exposed. Per step; exposed_share_of_step = exposed / "
          "the window, at most 1.")
# The record's short name for how exposed communication was measured (beside METHOD's sentence).
EXPOSED_METHOD = "profiler_timeline_within_step_window"
_COMM_WRAPPERS = ("c10d::", "record_param_comms", "nccl:")

Span = tuple[float, float]


def is_collective(name: str) -> bool:
    lowered = name.lower()
    return "nccl" in lowered or lowered.startswith("gloo:")


def kind_of(name: str) -> str:
    """ncclDevKernel_AllGather_RING_LL(...) -> allgather; gloo:all_reduce -> allreduce."""
    text = name.split("(")[0]
    if text.lower().startswith("gloo:"):
        return text[5:].replace("_", "").lower()
    text = re.sub(r"^nccl(Dev)?Kernel_", "", text)
    return text.split("_")[0].lower() or name


def merge(spans: list[Span]) -> list[Span]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(spans: list[Span]) -> float:
    return sum(b - a for a, b in spans)


def overlap(a: list[Span], b: list[Span]) -> float:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def clip(spans: list[Span], window: Span) -> list[Span]:
    """The parts of `spans` inside `window` (empty parts dropped)."""
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


def exposure(comm: list[Span], compute: list[Span], window: Span) -> dict[str, float]:
    """One step's split, every span cut to the step's window: {step, communication,
    exposed, hidden}, in the spans' unit. exposed <= communication <= step always."""
    comm, compute = merge(clip(comm, window)), merge(clip(compute, window))
    total = length(comm)
    hidden = min(overlap(comm, compute), total)
    return {"step": max(0.0, window[1] - window[0]), "communication": total, "exposed": total - hidden,
            "hidden": hidden}


def split(events, on_gpu: bool) -> tuple[list[Span], list[Span], dict[str, float], Span | None]:
    """(communication spans, compute spans, {kind: summed span}, the step's window) of one
    step's profiler events, in µs. The window spans every event of the step's device."""
    from torch.autograd import DeviceType

    comm, compute, kinds = [], [], {}
    first, last = float("inf"), float("-inf")
    for event in events:
        span = (event.time_range.start, event.time_range.end)
        name = event.name
        if (event.device_type == DeviceType.CUDA) != on_gpu or (on_gpu and event.is_user_annotation):
            continue  # on a GPU its kernels and copies (no host range); on CPU its operators
        collective = is_collective(name)
        if event.is_user_annotation and not collective:
            continue  # a range of the host's code, not work (gloo's work is recorded as one, though)
        first, last = min(first, span[0]), max(last, span[1])
        if collective:
            comm.append(span)
            kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + span[1] - span[0]
        elif on_gpu:
            compute.append(span)
        elif not event.cpu_children and not event.is_async and not name.startswith(_COMM_WRAPPERS):
            compute.append(span)
    return comm, compute, kinds, ((first, last) if last > first else None)


def _profiled_step(run, device, activities) -> tuple[dict[str, float], dict[str, float], int]:
    """One step under a profiler of its own: its split and its collectives by kind, in µs,
    and how many collective spans it had."""
    from torch.profiler import profile

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize(device)
    comm, compute, kinds, window = split(prof.events(), cuda)
    if window is None:
        return {"step": 0.0, "communication": 0.0, "exposed": 0.0, "hidden": 0.0}, kinds, 0
    return exposure(comm, compute, window), kinds, len(comm)


def communication_split(run, device, count: int, before=None) -> dict:
    """Communication, exposed and hidden milliseconds per step over `count` profiled steps
    of `run`, each after `before()` (module docstring)."""
    from torch.profiler import ProfilerActivity

    if count <= 0:
        return {"method": None, "reason": "comm_steps is 0"}
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    totals = {"step": 0.0, "communication": 0.0, "exposed": 0.0, "hidden": 0.0}
    kinds: dict[str, float] = {}
    spans = 0
    for _ in range(count):
        if before is not None:
            before()
        one, step_kinds, step_spans = _profiled_step(run, device, activities)
        for key in totals:
            totals[key] += one[key]
        for kind, us in step_kinds.items():
            kinds[kind] = kinds.get(kind, 0.0) + us
        spans += step_spans
    per_step = {key: value / 1e3 / count for key, value in totals.items()}
    total, hidden = per_step["communication"], per_step["hidden"]
    return {"method": METHOD, "exposed_method": EXPOSED_METHOD, "steps": count, "step_ms": per_step["step"],
            "communication_ms": total, "exposed_ms": per_step["exposed"], "hidden_ms": hidden,
            "hidden_fraction": hidden / total if total > 0 else None,
            "exposed_share_of_step": totals["exposed"] / totals["step"] if totals["step"] > 0 else None,
            "by_kind_ms": {k: v / 1e3 / count for k, v in sorted(kinds.items())}, "collective_spans": spans / count}
