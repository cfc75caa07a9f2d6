"""Learning-rate schedules: a multiplier of the peak learning rate at each step.

    scheduler = make_schedule("cosine", optimizer, total_steps=10_000, warmup_steps=500)
    for step in range(total_steps): ...; optimizer.step(); scheduler.step()

Every schedule starts with a linear warm-up: step s < warmup_steps trains at
(s + 1) / warmup_steps of the peak, so the first step already learns and the last
warm-up step reaches the peak. Then:

- `cosine`: half a cosine from the peak at step `warmup_steps` down to `floor` x peak at
  the last step (total_steps - 1). A floor (default 10%) rather than zero: the end of
  the run still learns, as in the Chinchilla and LLaMA recipes.
- `wsd` (warm-up, stable, decay): the peak until the last `decay_fraction` of the run
  (default 20%), then a straight line down to `floor` x peak at the last step. The
  stable phase makes runs of different lengths share their prefix.
- `constant`: the peak after warm-up.

Steps past the end keep the last step's value. The returned object is a
torch.optim.lr_scheduler.LambdaLR, so it checkpoints with its state_dict. To resume, make
the optimizer and the schedule first, then load both states: making a schedule sets every
group's learning rate to step 0's value, over whatever an earlier load put there.
"""
from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported when a schedule is made: the config reads SCHEDULES without it
    import torch

DEFAULT_FLOOR = 0.1
DEFAULT_DECAY_FRACTION = 0.2


def _warmup(step: int, warmup_steps: int) -> float | None:
    return (step + 1) / warmup_steps if step < warmup_steps else None


def _progress(step: int, start: int, total_steps: int) -> float:
    """0 at `start`, 1 at the last step (and after)."""
    return min(1.0, (step - start) / max(1, total_steps - 1 - start))


def cosine(step: int, *, total_steps: int, warmup_steps: int, floor: float, decay_fraction: float) -> float:
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * _progress(step, warmup_steps, total_steps)))


def decay_start(total_steps: int, decay_fraction: float) -> int:
    """The first step of wsd's decay: the last round(decay_fraction * total) steps decay
    (at least one)."""
    return total_steps - max(1, round(decay_fraction * total_steps))


def wsd(step: int, *, total_steps: int, warmup_steps: int, floor: float, decay_fraction: float) -> float:
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    start = decay_start(total_steps, decay_fraction)
    if step < start:
        return 1.0
    return 1 - (1 - floor) * _progress(step, start, total_steps)


def constant(step: int, *, total_steps: int, warmup_steps: int, floor: float, decay_fraction: float) -> float:
    warm = _warmup(step, warmup_steps)
    return 1.0 if warm is None else warm


SCHEDULES = {"cosine": cosine, "wsd": wsd, "constant": constant}


def lr_multiplier(name: str, step: int, *, total_steps: int, warmup_steps: int, floor: float = DEFAULT_FLOOR,
                  decay_fraction: float = DEFAULT_DECAY_FRACTION) -> float:
    """The fraction of the peak learning rate that schedule `name` gives `step`."""
    check_schedule(name, total_steps, warmup_steps, floor, decay_fraction)
    return SCHEDULES[name](step, total_steps=total_steps, warmup_steps=warmup_steps, floor=floor,
                           decay_fraction=decay_fraction)


def check_schedule(name: str, total_steps: int, warmup_steps: int, floor: float, decay_fraction: float) -> None:
    """A ValueError naming what is wrong, and what is allowed."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
    if total_steps < 1:
        raise ValueError(f"total_steps {total_steps} must be at least 1")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps {warmup_steps} must be at least 0 and less than total_steps {total_steps}")
    if not 0 <= floor <= 1:
        raise ValueError(f"floor {floor} must lie in [0, 1] (a fraction of the peak learning rate)")
    if name == "wsd":
        if not 0 < decay_fraction <= 1:
            raise ValueError(f"decay_fraction {decay_fraction} must lie in (0, 1]")
        start = decay_start(total_steps, decay_fraction)
        if start < warmup_steps:
            raise ValueError(f"wsd: warm-up ({warmup_steps} steps) and decay (the last {total_steps - start} of "
                             f"{total_steps} steps) overlap; shorten one")


def warmup_steps(total_steps: int, fraction: float) -> int:
    """The warm-up of a run of `total_steps` with a warm-up `fraction` of them: at least one step."""
    return max(1, round(float(fraction) * total_steps))


def make_schedule(name: str, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, *,
                  floor: float = DEFAULT_FLOOR, decay_fraction: float = DEFAULT_DECAY_FRACTION
                  ) -> torch.optim.lr_scheduler.LambdaLR:
    """Schedule `name` over `optimizer`'s learning rates (each group's lr is its peak).
    Call its step() after each optimizer step."""
    from torch.optim.lr_scheduler import LambdaLR

    check_schedule(name, total_steps, warmup_steps, floor, decay_fraction)
    rule = partial(SCHEDULES[name], total_steps=total_steps, warmup_steps=warmup_steps, floor=floor,
                   decay_fraction=decay_fraction)
    return LambdaLR(optimizer, rule)
