"""Workloads a control run drives: what calls arrive, and what happens around them.

- steady: one Llama-shaped attention call over and over (B4 H16 L4096 D128 bf16 by default,
  the shape of the measurements in docs/measurement.md);
- stream: the seed study's shapes mixed call by call (H8 D64, L 128-2048, batch 32/64/128),
  in a seeded random order;
plus, for any workload, a budget schedule (steps and ramps), co-located tenants (other
processes on the same GPU, flashwatt.control.tenants), spans in which the controller's NVML
readings fail, and a change of the workload mid-run.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import torch

from flashwatt.control.budget_schedule import BudgetSchedule
from flashwatt.control.cell import group_name
from flashwatt.control.tenants import Tenant

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

    @property
    def group(self) -> str:
        """The name of the workload's cells and oracle (flashwatt.control.cell)."""
        return group_name(self.kind, self.dtype, self.causal)

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
class Scenario:
    """One controlled (or static) run: a workload under a mode for `seconds`, and what
    happens around it (flashwatt.control.scenario_generator makes random ones)."""

    name: str
    workload: Workload = field(default_factory=Workload)
    mode: str = "budget"
    budget_w: float | None = None
    # (seconds from start, watts[, ramp seconds]), the first at 0 s; empty: `budget_w` throughout
    schedule: tuple[tuple[float, ...], ...] = ()
    seconds: float = 10.0
    configuration: str | None = None  # static mode
    duty: float = 1.0  # static mode
    max_slowdown: float | None = None
    tenants: tuple[Tenant, ...] = ()  # other processes on the same GPU
    nvml_failures: tuple[tuple[float, float], ...] = ()  # (from s, for s): the controller's readings fail
    mix_change: tuple[float, Workload] | None = None  # (at s, the workload from then on)
    # The relative error against float64 the user accepts: cheaper precisions may be taken
    # (flashwatt.control.controller), and the run's final check holds the output to it.
    precision_tolerance: float | None = None
    preheat_s: float = 0.0  # a hot start: the workload at full duty this long before the run
    temp_below_c: float | None = None  # ... and a temperature limit this far under where it left the board
    pace_cycle_s: float = 0.0  # attention calls paced in whole cycles of this length (0: each 2 ms quantum)
    pace_mix: tuple[float, float] | None = None  # (lower duty, period s): time-share it with full duty

    def budget(self) -> BudgetSchedule | None:
        if self.schedule:
            return BudgetSchedule.parse(self.schedule)
        return BudgetSchedule.constant(self.budget_w) if self.budget_w is not None else None

    def phases(self) -> list[tuple[float, Workload]]:
        """(from s, workload) in order."""
        return [(0.0, self.workload)] + ([self.mix_change] if self.mix_change else [])
