"""A power budget over time: steps and ramps, as a scenario sets them.

A schedule is a list of changes `(t, watts, ramp_s)`, the first at 0 s: from `t` the budget
moves to `watts`, at once (`ramp_s` 0, a step) or linearly over `ramp_s` seconds (a ramp).

    schedule = BudgetSchedule.parse([[0, 600], [1.5, 400], [6, 550, 2.0]])
    schedule.at(7.0)          # 500.0: halfway up the ramp
    schedule.steps()          # [(1.5, 400.0)]: the steps a settling time is measured after
    schedule.timeline(0.1)     # (t, watts) to hand `Governor.set_budget`, one per 0.1 s on a ramp

Ramps are handed to the controller as small changes, each under `STEP_MIN_W` (the
governor treats a smaller change as tracking, not as a step; flashwatt.control.governor),
and never count as steps in the figures of merit.
"""
from __future__ import annotations

from dataclasses import dataclass

# A budget change at least this large (watts) is a step: the controller re-decides at once,
# and the figures of merit time its settling. Generated steps are 50 W or more apart.
STEP_MIN_W = 20.0


@dataclass(frozen=True)
class BudgetChange:
    t: float
    watts: float
    ramp_s: float = 0.0

    def as_list(self) -> list[float]:
        return [self.t, self.watts] + ([self.ramp_s] if self.ramp_s else [])


@dataclass(frozen=True)
class BudgetSchedule:
    entries: tuple[BudgetChange, ...]

    def __post_init__(self) -> None:
        if not self.entries or self.entries[0].t != 0 or self.entries[0].ramp_s:
            raise ValueError("a budget schedule starts with a step at 0 s")
        ends = [c.t + c.ramp_s for c in self.entries]
        for prev_end, change in zip(ends, self.entries[1:]):
            if change.t < prev_end - 1e-9:
                raise ValueError(f"budget change at {change.t:g} s starts before the previous one ends "
                                 f"({prev_end:g} s)")
        for change in self.entries:
            if not change.watts > 0 or change.ramp_s < 0:
                raise ValueError(f"budget change {change.as_list()}: watts > 0 and a ramp of 0 s or more")

    @classmethod
    def parse(cls, items) -> "BudgetSchedule":
        """From [[t, watts], [t, watts, ramp_s], ...] (the spec's and the config's form)."""
        return cls(tuple(BudgetChange(float(item[0]), float(item[1]), float(item[2]) if len(item) > 2 else 0.0)
                         for item in items))

    @classmethod
    def constant(cls, watts: float) -> "BudgetSchedule":
        return cls((BudgetChange(0.0, float(watts)),))

    def as_lists(self) -> list[list[float]]:
        return [c.as_list() for c in self.entries]

    @property
    def first_w(self) -> float:
        return self.entries[0].watts

    def at(self, t: float) -> float:
        """The budget in force at `t` seconds from the start."""
        watts = self.entries[0].watts
        for change in self.entries[1:]:
            if t < change.t:
                break
            if change.ramp_s and t < change.t + change.ramp_s:
                return watts + (change.watts - watts) * (t - change.t) / change.ramp_s
            watts = change.watts
        return watts

    def steps(self) -> list[tuple[float, float]]:
        """(time, new budget) of each step after the start (ramps are not steps)."""
        out, before = [], self.entries[0].watts
        for change in self.entries[1:]:
            if not change.ramp_s and abs(change.watts - before) >= STEP_MIN_W:
                out.append((change.t, change.watts))
            before = change.watts
        return out

    def timeline(self, period_s: float = 0.1) -> list[tuple[float, float]]:
        """(t, watts) to set, in order, from the first change after 0 s: a step once, a ramp
        once per `period_s` along it (each of those changes is small: not a step)."""
        out: list[tuple[float, float]] = []
        before = self.entries[0].watts
        for change in self.entries[1:]:
            if change.ramp_s:
                n = max(1, round(change.ramp_s / period_s))
                for i in range(1, n + 1):
                    out.append((change.t + change.ramp_s * i / n, before + (change.watts - before) * i / n))
            else:
                out.append((change.t, change.watts))
            before = change.watts
        return out

    def describe(self) -> str:
        """e.g. "600W@0s 400W@1.5s ->550W@6-8s" (a ramp's arrow and span)."""
        parts = []
        for c in self.entries:
            if c.ramp_s:
                parts.append(f"->{c.watts:g}W@{c.t:g}-{c.t + c.ramp_s:g}s")
            else:
                parts.append(f"{c.watts:g}W@{c.t:g}s")
        return " ".join(parts)
