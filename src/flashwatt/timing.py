"""The one timing method of flashwatt: CUDA-graph replays of a batch of calls.

Why this method (docs/measurement.md has the measurements behind it):

- An event pair around each eagerly launched call times the GPU from the moment the
  start event is reached to the end event, so when the host launches slower than the
  GPU computes, the host's launch time lands inside the figure. For a 40 µs kernel on
  an H100 that made the timed median 45-90 µs, noisy from run to run, while the energy
  window (back-to-back calls) saw 40 µs.
- `triton.testing.do_bench` times repeats of one call on one input set (its L2 stays
  warm) and flushes the cache with a memset between calls: a different workload again.
- A CUDA graph of k calls replays them with no host in between. Timing each replay
  between two events and dividing by k gives the device time per call, right from a
  few microseconds up. Inputs rotate through the input sets inside the graph, so the
  repeats do not run from L2.

Launch overhead is real for users of eager PyTorch, so the same k calls are also timed
launched eagerly between two events, and the difference is recorded as its own figure
(`launch_overhead_ms`), never folded into the latency. The energy window drives the same
`Workload.step` that is timed here, so the timed latency and the window's time per call
describe the same work and can be compared (the aggregate flags a cell where they differ).

When a backend cannot be captured in a graph, the workload falls back to eager batches
of k calls between two events and records why. On a CPU, perf_counter times the batches.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from flashwatt.settings import MeasureSettings

# One step (one replay) should last at least this long: event resolution is ~0.5 µs
# and a replay launch costs a few µs, both far under 1% of 2 ms.
MIN_STEP_S = 2e-3
# Calls captured in one graph at most: bounds capture time and the graph's memory pool.
MAX_CALLS_PER_STEP = 256
# Eager batches timed for the launch-overhead figure.
EAGER_BATCHES = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calls_per_step(per_call_s: float) -> int:
    """How many calls one step holds so that a step lasts about MIN_STEP_S."""
    if per_call_s <= 0 or not math.isfinite(per_call_s):
        return 1
    return max(1, min(MAX_CALLS_PER_STEP, math.ceil(MIN_STEP_S / per_call_s)))


@dataclass
class Workload:
    """k back-to-back calls of one cell, runnable as one step (a graph replay or an eager batch)."""

    call: Callable[[int], object]
    device: torch.device
    k: int
    method: str = "eager_batch"  # "cuda_graph", "eager_batch" (fallback on CUDA) or "perf_counter" (CPU)
    fallback_reason: str | None = None
    _graph: object = field(default=None, repr=False)

    @classmethod
    def build(cls, call: Callable[[int], object], device: torch.device, per_call_s: float,
              use_graph: bool = True) -> "Workload":
        k = calls_per_step(per_call_s)
        if device.type != "cuda":
            return cls(call, device, k, method="perf_counter")
        if not use_graph:
            return cls(call, device, k, fallback_reason="CUDA graphs switched off (measure.cuda_graph: false)")
        try:
            graph = _capture(call, device, k)
        except Exception as err:  # a backend refusing capture is an outcome, not an error
            if torch.cuda.is_available():
                _sync(device)  # drain what the failed capture left queued
            return cls(call, device, k, fallback_reason=f"graph capture failed: {type(err).__name__}: "
                                                        f"{str(err).splitlines()[0] if str(err) else ''}")
        return cls(call, device, k, method="cuda_graph", _graph=graph)

    def step(self) -> None:
        """Run the k calls once (asynchronously on CUDA)."""
        if self._graph is not None:
            self._graph.replay()
        else:
            self.eager_step()

    def eager_step(self) -> None:
        for i in range(self.k):
            self.call(i)


def _capture(call: Callable[[int], object], device: torch.device, k: int):
    """A CUDA graph of calls 0..k-1 (each on input set i mod sets)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
        for i in range(min(k, 3)):
            call(i)
    torch.cuda.current_stream(device).wait_stream(side)
    _sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(k):
            call(i)
    _sync(device)
    return graph


def _time_steps(run: Callable[[], None], device: torch.device, n: int) -> list[float]:
    """Seconds of each of n runs of `run`: CUDA events on GPU, perf_counter on CPU."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        _sync(device)
        for start, end in events:
            start.record()
            run()
            end.record()
        _sync(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    seconds = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return seconds


def steps_wanted(step_s: float, settings: MeasureSettings) -> int:
    """Timed steps: at least min_repeats and min_time_ms of device time, at most max_repeats."""
    wanted = math.ceil(settings.min_time_ms / 1e3 / max(step_s, 1e-9))
    return max(settings.min_repeats, min(settings.max_repeats, wanted))


def per_call_stats(step_seconds: list[float], k: int) -> dict:
    """Median, mean, spread and deciles of the time per call, in ms."""
    per_call_ms = [s * 1e3 / k for s in step_seconds]
    deciles = statistics.quantiles(per_call_ms, n=10) if len(per_call_ms) >= 2 else [per_call_ms[0]] * 9
    return {
        "median_ms": statistics.median(per_call_ms),
        "mean_ms": statistics.fmean(per_call_ms),
        "std_ms": statistics.pstdev(per_call_ms),
        "min_ms": min(per_call_ms),
        "p10_ms": deciles[0],
        "p90_ms": deciles[-1],
    }


def time_workload(workload: Workload, settings: MeasureSettings) -> dict:
    """Time the workload's steps; per-call statistics in ms, plus the eager launch figure."""
    device = workload.device
    probe = _time_steps(workload.step, device, 3)  # also warms the graph's first replays
    n = steps_wanted(statistics.median(probe), settings)
    steps = _time_steps(workload.step, device, n)
    timing = {
        "method": workload.method,
        "calls_per_step": workload.k,
        "steps": len(steps),
        "repeats": len(steps) * workload.k,
        **per_call_stats(steps, workload.k),
        # Each timed step's time per call: the cell's own repeats, from which a comparison
        # of two runs draws its interval (flashwatt.compare.intervals).
        "per_call_ms": [s * 1e3 / workload.k for s in steps],
    }
    if workload.fallback_reason:
        timing["fallback_reason"] = workload.fallback_reason
    if workload.method == "cuda_graph":
        eager = _time_steps(workload.eager_step, device, EAGER_BATCHES)
        timing["eager_ms"] = statistics.median(eager) * 1e3 / workload.k
        timing["launch_overhead_ms"] = timing["eager_ms"] - timing["median_ms"]
    return timing
