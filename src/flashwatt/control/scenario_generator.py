"""Random control scenarios from a seed: what a shared node does to a power budget.

`generate(seed, index, workload, settings)` is a pure function of its arguments, so the
scenario `random-<seed>-<index>` is the same on every machine and every run, and does not
depend on how many scenarios a suite asks for (a suite of 20 and one of 40 share their
first 20). Every scenario holds:

- a budget schedule: a first budget, then 2 to 5 changes up and down of 50-300 W at random
  times (0.1 s resolution), about half the scenarios with one in the first 2 s (during the
  controller's exploration when it starts cold); a change is a ramp over 1-3 s a quarter of
  the time (flashwatt.control.budget_schedule);
and, some of the time,
- co-located tenants: another process on the same GPU running compute-bound bf16 GEMMs
  (`gemm`) or memory-bound copies (`copy`), at a random intensity (the share of time it
  keeps the GPU busy), start and length (flashwatt.control.tenants);
- NVML read failures: spans in which the controller's readings fail (0.2-2.5 s; under
  0.5 s the controller holds, above it falls back);
- a change of the workload's shape mix mid-run (steady <-> stream).

Each class is forced on for one index in five (index % 5 == 1 ramps, 2 tenants, 3 NVML
failures, 4 a mix change), so any five consecutive scenarios hold every class; otherwise
each appears at random. `GENERATOR_VERSION` is recorded with every scenario: a change to
this file that changes what a seed gives must bump it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from flashwatt.control.budget_schedule import BudgetSchedule

GENERATOR_VERSION = 1
TENANT_KINDS = ("gemm", "copy")
# The workload a mix change moves to (flashwatt.control.workloads has the shapes).
OTHER_WORKLOAD = {"steady": "stream", "stream": "steady"}
SCENARIO_CLASSES = ("steps", "ramps", "tenants", "nvml_failures", "mix_change")
# Probability of each optional class where it is not forced by the index.
P_RAMP, P_TENANT, P_SECOND_TENANT, P_NVML, P_MIX = 0.25, 0.35, 0.3, 0.25, 0.25
MIN_GAP_S = 0.6  # between budget changes
# A ramp moves at most this fast: each 0.1 s of it is a change under STEP_MIN_W, not a step.
RAMP_W_PER_S = 150.0


@dataclass(frozen=True)
class GeneratorSettings:
    seconds: float = 10.0
    budget_range_w: tuple[float, float] = (250.0, 650.0)
    step_w: tuple[float, float] = (50.0, 300.0)
    changes: tuple[int, int] = (2, 5)

    def __post_init__(self) -> None:
        lo, hi = self.budget_range_w
        if not 0 < lo < hi or hi - lo < self.step_w[0]:
            raise ValueError(f"budget_range_w {list(self.budget_range_w)}: low < high, at least "
                             f"{self.step_w[0]:g} W apart")
        if not 0 < self.step_w[0] <= self.step_w[1]:
            raise ValueError(f"step_w {list(self.step_w)}: 0 < smallest <= largest")
        if self.seconds < 4:
            raise ValueError(f"seconds={self.seconds:g}: a random scenario needs at least 4 s")


def _r(x: float, step: float = 0.1) -> float:
    return round(round(x / step) * step, 3)


def _next_budget(rng: random.Random, now: float, settings: GeneratorSettings) -> float:
    lo, hi = settings.budget_range_w
    delta = rng.uniform(*settings.step_w)
    sign = rng.choice((-1, 1))
    if not lo <= now + sign * delta <= hi:
        sign = -sign
    if not lo <= now + sign * delta <= hi:  # the range is narrow here: the largest change that fits
        delta = max(settings.step_w[0], max(hi - now, now - lo))
        sign = 1 if hi - now >= now - lo else -1
    return float(round(now + sign * delta))


def _times(rng: random.Random, count: int, settings: GeneratorSettings) -> list[float]:
    """`count` change times in [0.3 s, seconds - 1 s], at least MIN_GAP_S apart; with
    probability 1/2 the first in the first 2 s (the controller is still exploring)."""
    span = settings.seconds - 1.3 - (count - 1) * MIN_GAP_S
    if span <= 0:
        raise ValueError(f"seconds={settings.seconds:g} is too short for {count} budget changes")
    points = sorted(rng.uniform(0.0, span) for _ in range(count))
    if rng.random() < 0.5:
        points[0] = rng.uniform(0.0, min(1.7, span))
        points = [points[0]] + sorted(max(points[0], p) for p in points[1:])
    return [_r(0.3 + p + i * MIN_GAP_S) for i, p in enumerate(points)]


def _schedule(rng: random.Random, index: int, settings: GeneratorSettings) -> BudgetSchedule:
    steps = rng.randint(*settings.changes)
    ramps = 1 if (index % 5 == 1 or rng.random() < P_RAMP) else 0
    times = _times(rng, steps + ramps, settings)
    rooms = [(b - a) for a, b in zip(times, [*times[1:], settings.seconds - 0.3])]
    # the ramp goes where it has the most room; it moves at most RAMP_W_PER_S
    ramp_at = max(range(len(times)), key=lambda i: rooms[i]) if ramps else -1
    items: list[list[float]] = [[0.0, float(round(rng.uniform(*settings.budget_range_w)))]]
    for i, t in enumerate(times):
        watts = _next_budget(rng, items[-1][1], settings)
        if i == ramp_at:
            length = min(rng.uniform(1.0, 3.0), rooms[i] - 0.1)
            delta = watts - items[-1][1]
            if abs(delta) > RAMP_W_PER_S * length:
                watts = items[-1][1] + (1 if delta > 0 else -1) * RAMP_W_PER_S * length
            if length >= 0.5 and abs(watts - items[-1][1]) >= settings.step_w[0] / 2:
                items.append([t, float(round(watts)), _r(length)])
                continue
            watts = _next_budget(rng, items[-1][1], settings)
        items.append([t, watts])
    return BudgetSchedule.parse(items)


def _tenants(rng: random.Random, index: int, settings: GeneratorSettings) -> list[dict]:
    if not (index % 5 == 2 or rng.random() < P_TENANT):
        return []
    count = 2 if rng.random() < P_SECOND_TENANT else 1
    out = []
    for _ in range(count):
        start = _r(rng.uniform(0.5, settings.seconds - 1.5))
        out.append({"kind": rng.choice(TENANT_KINDS), "intensity": round(rng.uniform(0.1, 1.0), 2),
                    "start_s": start, "seconds": _r(rng.uniform(1.0, max(1.0, settings.seconds - start - 0.3)))})
    return sorted(out, key=lambda tenant: tenant["start_s"])


def _nvml_failures(rng: random.Random, index: int, settings: GeneratorSettings) -> list[list[float]]:
    if not (index % 5 == 3 or rng.random() < P_NVML):
        return []
    spans: list[list[float]] = []
    for _ in range(rng.randint(1, 2)):
        start = _r(rng.uniform(0.5, settings.seconds - 1.0))
        length = _r(rng.uniform(0.2, 2.5))
        if all(start >= s + d + 0.5 or start + length + 0.5 <= s for s, d in spans):
            spans.append([start, length])
    return sorted(spans)


def _mix_change(rng: random.Random, index: int, workload: str, settings: GeneratorSettings) -> dict | None:
    if workload not in OTHER_WORKLOAD or not (index % 5 == 4 or rng.random() < P_MIX):
        return None
    return {"at_s": _r(rng.uniform(1.5, settings.seconds - 2.0)), "to": OTHER_WORKLOAD[workload]}


def generate(seed: int, index: int, workload: str = "steady", settings: GeneratorSettings = GeneratorSettings()) -> dict:
    """The scenario `random-<seed>-<index>` of a workload, as plain data (a cell's spec)."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed {seed} and index {index}: whole numbers >= 0")
    # One stream per part, each seeded by (seed, index, part): a part's draws never shift
    # another's, and the workload enters only the mix change (paired scenarios across workloads).
    streams = {part: random.Random(f"flashwatt-control-{seed}-{index}-{part}")
               for part in ("budget", "tenants", "nvml", "mix")}
    return {
        "generator": {"seed": seed, "index": index, "version": GENERATOR_VERSION},
        "seconds": settings.seconds,
        "schedule": _schedule(streams["budget"], index, settings).as_lists(),
        "tenants": _tenants(streams["tenants"], index, settings),
        "nvml_failures": _nvml_failures(streams["nvml"], index, settings),
        "mix_change": _mix_change(streams["mix"], index, workload, settings),
    }


def classes(scenario: dict) -> list[str]:
    """The scenario classes a generated scenario holds (SCENARIO_CLASSES, in that order)."""
    schedule = BudgetSchedule.parse(scenario["schedule"])
    held = {"steps": bool(schedule.steps()), "ramps": any(c.ramp_s for c in schedule.entries),
            "tenants": bool(scenario.get("tenants")), "nvml_failures": bool(scenario.get("nvml_failures")),
            "mix_change": bool(scenario.get("mix_change"))}
    return [name for name in SCENARIO_CLASSES if held[name]]


def describe_tenants(tenants: list[dict]) -> str:
    return "; ".join(f"{t['kind']} x{t['intensity']:g} {t['start_s']:g}-{t['start_s'] + t['seconds']:g}s"
                     for t in tenants or [])


def describe_failures(spans: list[list[float]]) -> str:
    return "; ".join(f"{s:g}-{s + d:g}s" for s, d in spans or [])
