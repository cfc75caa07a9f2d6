"""What a model or training cell runs under the step-level controller, in one token of its
name (flashwatt.models.cell, flashwatt.training.cell):

    budget450w                      hold 450 W
    budget600w-400w_at20s           a budget schedule: 600 W, then 400 W from 20 s
    budget450w-limit83c             ... and a temperature limit of 83 degC alongside it
    energy                          minimise joules per token
    front                           the static front: every (backend x pacing x micro-batch)
                                    point the cell's settings name, one after another

A suite gives them as a list under a grid's `governors` key:

    governors:
      - {mode: budget, budgets_w: [300, 450, 650]}       # one cell per budget
      - {mode: budget, schedule: [[0, 600], [20, 400]], temp_limit_c: 83}
      - {mode: energy}
      - {mode: front}
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flashwatt.config_error import ConfigError

GOVERNOR_MODES = ("budget", "energy", "front")
GOVERNOR_RE = r"(?:front|energy|budget\d+w(?:-\d+w_at\d+s)*(?:-limit\d+c)?)"
_PARSE = re.compile(r"^(?P<mode>front|energy|budget)(?P<first>\d+)?(?:w)?(?P<steps>(?:-\d+w_at\d+s)*)"
                    r"(?:-limit(?P<limit>\d+)c)?$")
_STEP = re.compile(r"-(\d+)w_at(\d+)s")


@dataclass(frozen=True, order=True)
class GovernorSetting:
    mode: str
    schedule: tuple[tuple[int, int], ...] = ()  # (seconds from the start, watts), the first at 0
    temp_limit_c: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in GOVERNOR_MODES:
            raise ValueError(f"governor mode {self.mode!r}: allowed {', '.join(GOVERNOR_MODES)}")
        if (self.mode == "budget") != bool(self.schedule):
            raise ValueError(f"governor mode {self.mode}: " + ("needs a budget (budgets_w or schedule)"
                                                               if self.mode == "budget" else "takes no budget"))
        times = [t for t, _ in self.schedule]
        if times and (times[0] != 0 or any(b <= a for a, b in zip(times, times[1:]))):
            raise ValueError(f"budget schedule {list(self.schedule)}: the first step at 0 s, then increasing times")
        if any(not (isinstance(w, int) and w > 0 and isinstance(t, int) and t >= 0) for t, w in self.schedule):
            raise ValueError(f"budget schedule {list(self.schedule)}: whole seconds >= 0 and whole watts > 0")
        if self.temp_limit_c is not None and (self.mode != "budget" or not 0 < self.temp_limit_c < 150):
            raise ValueError(f"temp_limit_c={self.temp_limit_c!r}: a whole degC limit held alongside a budget")

    @property
    def token(self) -> str:
        if self.mode != "budget":
            return self.mode
        first = f"budget{self.schedule[0][1]}w" + "".join(f"-{w}w_at{t}s" for t, w in self.schedule[1:])
        return first + (f"-limit{self.temp_limit_c}c" if self.temp_limit_c is not None else "")

    @classmethod
    def parse(cls, token: str) -> "GovernorSetting":
        match = _PARSE.match(token)
        if not match or (match["mode"] == "budget") != bool(match["first"]):
            raise ValueError(f"not a governor setting: {token!r} (expected e.g. budget450w, budget600w-400w_at20s, "
                             "energy, front)")
        schedule = ()
        if match["first"]:
            schedule = ((0, int(match["first"])),) + tuple((int(t), int(w)) for w, t in _STEP.findall(match["steps"]))
        return cls(match["mode"], schedule, int(match["limit"]) if match["limit"] else None)

    def budget(self):
        """The budget schedule (flashwatt.control.budget_schedule.BudgetSchedule), None without a budget."""
        from flashwatt.control.budget_schedule import BudgetSchedule

        return BudgetSchedule.parse([[t, w] for t, w in self.schedule]) if self.schedule else None

    @property
    def controller_mode(self) -> str:
        """The Controller's mode: the front's points are static runs."""
        return "static" if self.mode == "front" else self.mode


def settings_from_config(entries: list[dict], key: str) -> list[GovernorSetting]:
    """A grid's `governors` list, one setting per budget; a bad entry names `<key>[i]`."""
    out = []
    for i, entry in enumerate(entries):
        where = f"config key {key}[{i}]"
        mode = entry.get("mode")
        if "budgets_w" in entry and "schedule" in entry:
            raise ConfigError(f"{where}: give budgets_w or schedule, not both")
        if mode == "budget":
            if "schedule" in entry:
                schedules = [tuple((int(t), int(w)) for t, w in entry["schedule"])]
            elif "budgets_w" in entry:
                schedules = [((0, int(w)),) for w in entry["budgets_w"]]
            else:
                raise ConfigError(f"{where}: mode budget needs budgets_w or schedule")
        elif "budgets_w" in entry or "schedule" in entry:
            raise ConfigError(f"{where}: mode {mode} takes no budgets_w or schedule")
        else:
            schedules = [()]
        for schedule in schedules:
            try:
                out.append(GovernorSetting(mode, schedule, entry.get("temp_limit_c")))
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
    return out
