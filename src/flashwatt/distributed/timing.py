"""Timing of distributed calls: a barrier before each, CUDA events (perf_counter on CPU)."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(device) -> None:
    sync(device)
    dist.barrier()


def median_ms(fn, device, repeats: int, warmup: int, before=None, together: bool = True) -> float:
    """Median ms of fn(before()) over `repeats` (after `warmup`); together: every rank starts
    each call after a barrier (False: this rank alone, the others elsewhere)."""
    times = []
    for i in range(warmup + repeats):
        state = before() if before else None
        if together:
            barrier(device)
        else:
            sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(state)
            end.record()
            sync(device)
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn(state)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def gather(value) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
