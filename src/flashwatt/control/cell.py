"""A control cell: one controlled run (or the oracle of static runs) of a workload, the
single source of its names and paths, as `flashwatt.attention.cell.Cell` is for attention cells.

Paths sit beside the suite's attention cells:

    results/cells/<suite>/control/<workload>-<precision>-<mask>/<scenario>.json

where the scenario names what the run does, so that asking for a file reruns exactly it:

    oracle                                 every static configuration, one after another
    budget-450w                            hold 450 W
    budget-600w-400w_at6s-550w_at11s       a budget schedule: 600 W, 400 W from 6 s, ...
    energy, energy-slowdown5pct            minimise joules per token (within 5% of the fastest)
    budget-500w-colocated_at8s             ...with another process's load from 8 s
    budget-450w-nvml_failure_at5s          ...with NVML failing from 5 s
    budget-650w-hot_start_at30s            ...on a board preheated for 30 s at full duty first,
                                           with a temperature limit held alongside the budget
                                           (`hot_start.below_c` under where the preheat left it)
    random-41-7                            the 8th scenario generated from seed 41
                                           (flashwatt.control.scenario_generator)

What a run's name does not say (its length, the co-located load's duty, the oracle's
configurations) comes from the config and is recorded in the cell's record.
`ControlCell.from_path(cell.path) == cell` holds for every valid cell.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flashwatt.cell_files import CellFiles, file_patterns

WORKLOADS = ("steady", "stream")
# Why a control cell is skipped where no CUDA device is visible (its job and the planning say it).
NO_CUDA_REASON = "control cells drive a CUDA GPU; none is visible"
CONTROL_PRECISIONS = ("bf16", "fp16", "fp32")
CONTROL_MODES = ("budget", "energy", "oracle", "random")
DISTURBANCES = ("colocated", "nvml_failure", "hot_start")

CONTROL_FOLDER = "control"
_WHERE = "/{suite}/" + CONTROL_FOLDER + "/{group}/{scenario}"
RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns(_WHERE)

_GROUP_RE = (f"(?P<workload>{'|'.join(WORKLOADS)})-(?P<precision>{'|'.join(CONTROL_PRECISIONS)})"
             "-(?P<mask>full|causal)")
_SCENARIO_RE = (
    r"(?:(?P<mode>oracle|energy|budget)"
    r"(?:-(?P<first>\d+)w(?P<steps>(?:-\d+w_at\d+s)*))?"
    r"(?:-slowdown(?P<slowdown>\d+)pct)?"
    rf"(?:-(?P<disturbance>{'|'.join(DISTURBANCES)})_at(?P<at>\d+)s)?"
    r"|random-(?P<seed>\d+)-(?P<index>\d+))"
)
_GROUP, _SCENARIO = re.compile(f"^{_GROUP_RE}$"), re.compile(f"^{_SCENARIO_RE}$")
_STEP = re.compile(r"-(\d+)w_at(\d+)s")
_TOKEN = re.compile("^[a-z0-9_]+$")
# What each wildcard of the control rule may match (the patterns without group names).
WILDCARD_CONSTRAINTS = {
    "group": re.sub(r"\?P<\w+>", "", _GROUP_RE),
    "scenario": re.sub(r"\?P<\w+>", "", _SCENARIO_RE),
}


def group_name(workload: str, precision: str, causal: bool) -> str:
    """e.g. steady-bf16-full: a workload with its inputs' precision and mask."""
    return f"{workload}-{precision}-{'causal' if causal else 'full'}"


@dataclass(frozen=True, order=True)
class ControlCell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    workload: str = "steady"
    precision: str = "bf16"
    causal: bool = False
    mode: str = "budget"
    budgets: tuple[tuple[int, int], ...] = ()  # (seconds from the start, watts), the first at 0
    disturbance: str = ""
    disturbance_at_s: int = 0
    max_slowdown_pct: int | None = None
    seed: int | None = None  # a generated scenario (mode random): the generator's seed
    index: int | None = None  # ... and which of its scenarios

    def __post_init__(self) -> None:
        def refuse(what: str) -> None:
            raise ValueError(f"control cell {what}")

        if not _TOKEN.match(self.suite):
            refuse(f"suite={self.suite!r}: use lower-case letters, digits, _")
        if self.workload not in WORKLOADS:
            refuse(f"workload={self.workload!r}: allowed {', '.join(WORKLOADS)}")
        if self.precision not in CONTROL_PRECISIONS:
            refuse(f"precision={self.precision!r}: allowed {', '.join(CONTROL_PRECISIONS)}")
        if self.mode not in CONTROL_MODES:
            refuse(f"mode={self.mode!r}: allowed {', '.join(CONTROL_MODES)}")
        if self.mode == "budget":
            if not self.budgets:
                refuse("mode budget needs a budget (budgets_w or schedule)")
            times = [t for t, _ in self.budgets]
            if times[0] != 0 or any(b <= a for a, b in zip(times, times[1:])):
                refuse(f"budget schedule {list(self.budgets)}: the first step at 0 s, then increasing times")
            for t, watts in self.budgets:
                if not (isinstance(t, int) and isinstance(watts, int)) or watts <= 0 or t < 0:
                    refuse(f"budget step ({t!r} s, {watts!r} W): whole seconds >= 0 and whole watts > 0")
        elif self.budgets:
            refuse(f"mode {self.mode} takes no budget (got {list(self.budgets)})")
        if self.max_slowdown_pct is not None and (self.mode != "energy" or self.max_slowdown_pct < 0):
            refuse(f"max_slowdown_pct={self.max_slowdown_pct!r}: a whole percentage >= 0, energy mode only")
        if self.disturbance and (self.disturbance not in DISTURBANCES or self.mode == "oracle"):
            refuse(f"disturbance={self.disturbance!r}: allowed {', '.join(DISTURBANCES)}, not in the oracle")
        if self.disturbance_at_s and not self.disturbance:
            refuse(f"disturbance_at_s={self.disturbance_at_s!r} without a disturbance")
        generated = (self.seed, self.index) != (None, None)
        if self.mode == "random":
            if not (isinstance(self.seed, int) and isinstance(self.index, int) and self.seed >= 0 and self.index >= 0):
                refuse(f"mode random needs a seed and an index, whole numbers >= 0 (got {self.seed!r}, {self.index!r})")
            if self.disturbance or self.max_slowdown_pct is not None:
                refuse("mode random: its scenario comes from the generator (no disturbance or slowdown)")
        elif generated:
            refuse(f"seed and index name a generated scenario: mode random only (mode is {self.mode})")

    # ---- names -------------------------------------------------------------------
    @property
    def group(self) -> str:
        """The workload a run drives: the cells compared side by side share it."""
        return group_name(self.workload, self.precision, self.causal)

    @property
    def scenario(self) -> str:
        if self.mode == "random":
            return f"random-{self.seed}-{self.index}"
        name = self.mode
        if self.budgets:
            name += f"-{self.budgets[0][1]}w" + "".join(f"-{w}w_at{t}s" for t, w in self.budgets[1:])
        if self.max_slowdown_pct is not None:
            name += f"-slowdown{self.max_slowdown_pct}pct"
        if self.disturbance:
            name += f"-{self.disturbance}_at{self.disturbance_at_s}s"
        return name

    @property
    def id(self) -> str:
        return f"{self.suite}/{CONTROL_FOLDER}/{self.group}/{self.scenario}"

    @property
    def wildcards(self) -> dict[str, str]:
        return {"suite": self.suite, "group": self.group, "scenario": self.scenario}

    @property
    def budget_w(self) -> int | None:
        """The budget at the start of the run."""
        return self.budgets[0][1] if self.budgets else None

    @classmethod
    def from_wildcards(cls, suite: str, group: str, scenario: str) -> "ControlCell":
        g, s = _GROUP.match(group), _SCENARIO.match(scenario)
        if not g:
            raise ValueError(f"not a control workload: {group!r} (expected e.g. steady-bf16-full)")
        if not s:
            raise ValueError(f"not a control scenario: {scenario!r} (expected e.g. budget-450w, energy, oracle)")
        if s["seed"] is not None:
            return cls(suite, g["workload"], g["precision"], g["mask"] == "causal", "random",
                       seed=int(s["seed"]), index=int(s["index"]))
        budgets: tuple[tuple[int, int], ...] = ()
        if s["first"]:
            budgets = ((0, int(s["first"])),) + tuple((int(t), int(w)) for w, t in _STEP.findall(s["steps"]))
        return cls(suite, g["workload"], g["precision"], g["mask"] == "causal", s["mode"], budgets,
                   s["disturbance"] or "", int(s["at"] or 0),
                   int(s["slowdown"]) if s["slowdown"] is not None else None)


    def as_row(self) -> dict:
        """Flat dict for records and tables."""
        return {
            "suite": self.suite, "workload": self.workload, "precision": self.precision, "causal": self.causal,
            "mode": self.mode, "group": self.group, "scenario": self.scenario, "budget_w": self.budget_w,
            "budget_schedule": " ".join(f"{w}W@{t}s" for t, w in self.budgets),
            "disturbance": self.disturbance, "disturbance_at_s": self.disturbance_at_s if self.disturbance else None,
            "max_slowdown_pct": self.max_slowdown_pct, "random_seed": self.seed, "random_index": self.index,
            "cell_id": self.id,
        }
