"""Workloads a control run drives: what calls arrive, and what happens around them.

- steady: one Llama-shaped attention call over and over (B4 H16 L4096 D128 bf16 by default,
  the shape of the measurements in docs/measurement.md);
- stream: the seed study's shapes mixed call by call (H8 D64, L 128-2048, batch 32/64/128),
  in a seeded random order;
plus, for any workload, a budget schedule (time -> watts) and a co-located load: another
process on the same GPU, started mid-run, that the controller does not control.
"""
from __future__ import annotations

import itertools
import random
import subprocess
import sys
from dataclasses import dataclass, field

import torch

STEADY_SHAPE = (4, 16, 4096, 128)
STREAM_SEQ_LENS = (128, 256, 512, 1024, 2048)
STREAM_BATCHES = (32, 64, 128)
STREAM_HEADS, STREAM_HEAD_DIM = 8, 64


@dataclass(frozen=True)
class Workload:
    kind: str = "steady"  # steady | stream
    dtype: str = "bf16"
    causal: bool = False
    shape: tuple[int, int, int, int] = STEADY_SHAPE
    seed: int = 0

    def shapes(self) -> list[tuple[int, int, int, int]]:
        if self.kind == "steady":
            return [self.shape]
        if self.kind == "stream":
            return [(b, STREAM_HEADS, L, STREAM_HEAD_DIM) for L in STREAM_SEQ_LENS for b in STREAM_BATCHES]
        raise ValueError(f"workload kind {self.kind!r}: allowed steady, stream")

    def inputs(self, device: torch.device) -> dict[tuple, tuple[torch.Tensor, ...]]:
        """One seeded (q, k, v) per shape (randn, never zeros)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.dtype]
        gen = torch.Generator(device=device).manual_seed(self.seed)
        out = {}
        for shape in self.shapes():
            out[shape] = tuple(torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
                               for _ in range(3))
        return out

    def order(self) -> "itertools.cycle | iter":
        """The shapes of successive calls: always the one, or a seeded random mix."""
        shapes = self.shapes()
        if len(shapes) == 1:
            return itertools.repeat(shapes[0])
        rng = random.Random(self.seed)
        return iter(lambda: rng.choice(shapes), None)


@dataclass(frozen=True)
class ColocatedLoad:
    """Another process's matmuls on the same GPU from `start_s`, at `duty` of the time."""

    start_s: float
    duty: float = 0.3
    seconds: float = 8.0
    size: int = 8192

    def start(self, device_index: int, run_start: float) -> subprocess.Popen:
        """Start the process now; its load begins at `run_start + start_s` on the monotonic
        clock (system-wide on Linux), so the seconds it spends importing torch and warming
        up do not delay the disturbance."""
        code = (
            "import sys, time, torch\n"
            f"torch.cuda.set_device({device_index})\n"
            f"a = torch.randn({self.size}, {self.size}, device='cuda', dtype=torch.bfloat16)\n"
            "(a @ a); torch.cuda.synchronize()\n"
            f"begin = {run_start + self.start_s!r}\n"
            "time.sleep(max(0.0, begin - time.monotonic()))\n"
            f"end = begin + {self.seconds}\n"
            "while time.monotonic() < end:\n"
            "    t0 = time.perf_counter(); a @ a; torch.cuda.synchronize(); busy = time.perf_counter() - t0\n"
            f"    time.sleep(busy * (1 - {self.duty}) / {self.duty})\n"
        )
        return subprocess.Popen([sys.executable, "-c", code])


@dataclass(frozen=True)
class Scenario:
    """One controlled (or static) run: a workload under a mode for `seconds`."""

    name: str
    workload: Workload = field(default_factory=Workload)
    mode: str = "budget"
    budget_w: float | None = None
    schedule: tuple[tuple[float, float], ...] = ()  # (seconds from start, watts)
    seconds: float = 10.0
    configuration: str | None = None  # static mode
    duty: float = 1.0  # static mode
    max_slowdown: float | None = None
    colocated: ColocatedLoad | None = None
    fail_telemetry_after_s: float | None = None
