"""How much of a multi-GPU step is communication, and how much of that is hidden under
compute, read from the profiler's timeline of steps of their own.

`communication_split(run, device, count)` runs `count` steps under torch.profiler and
splits the timeline:

- communication: the union of the collectives' spans. On a GPU, every NCCL kernel (FSDP's
  all-gathers and reduce-scatters, the ring's send/receive, Ulysses' all-to-all, the
  gradient all-reduce). An NCCL kernel starts when its stream reaches it and ends when
  every rank has taken part, so a rank's wait for a slower one counts as communication.
  On CPU (gloo processes), the spans of gloo's work (`gloo:*` events).
- exposed: the part of the communication during which no compute ran (no other GPU
  kernel or copy; on CPU no other innermost operator on any thread): time the step
  spent on communication alone.
- hidden: communication minus exposed, the part overlapped by compute.

Every figure is per step (the totals over `count`); `by_kind_ms` sums each collective
kind's own spans (they may overlap one another, so they can add up to more than the
union). The profiler adds a little host overhead, which is why these steps are not the
timed ones.
"""
from __future__ import annotations

import re

import torch

METHOD = ("torch.profiler timeline of steps of their own: communication = union of the collectives' spans "
          "(NCCL kernels on a GPU, which include waiting for the other ranks; gloo work spans on CPU); "
          "exposed = the part of it with no compute running (no other GPU kernel or copy; on CPU no other "
          "innermost operator); hidden = communication - exposed. Per step.")
_COMM_WRAPPERS = ("c10d::", "record_param_comms", "nccl:")


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


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
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


def split(events, on_gpu: bool) -> tuple[list, list, dict]:
    """(communication spans, compute spans, {kind: summed span}) of profiler events, in µs."""
    from torch.autograd import DeviceType

    comm, compute, kinds = [], [], {}
    for event in events:
        span = (event.time_range.start, event.time_range.end)
        name = event.name
        if on_gpu and event.device_type != DeviceType.CUDA:
            continue
        if is_collective(name):
            comm.append(span)
            kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + span[1] - span[0]
        elif on_gpu:
            compute.append(span)
        elif (event.device_type == DeviceType.CPU and not event.cpu_children and not event.is_async
              and not event.is_user_annotation and not name.startswith(_COMM_WRAPPERS)):
            compute.append(span)
    return comm, compute, kinds


def communication_split(run, device, count: int) -> dict:
    """Communication, exposed and hidden milliseconds per step over `count` profiled calls of `run`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    if count <= 0:
        return {"method": None, "reason": "comm_steps is 0"}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(count):
            run()
        if cuda:
            torch.cuda.synchronize(device)
    comm, compute, kinds = split(prof.events(), cuda)
    spans = len(comm)
    comm, compute = merge(comm), merge(compute)
    total = length(comm) / 1e3 / count
    hidden = overlap(comm, compute) / 1e3 / count
    return {"method": METHOD, "steps": count, "communication_ms": total, "exposed_ms": total - hidden,
            "hidden_ms": hidden, "hidden_fraction": hidden / total if total > 0 else None,
            "by_kind_ms": {k: v / 1e3 / count for k, v in sorted(kinds.items())}, "collective_spans": spans / count}
