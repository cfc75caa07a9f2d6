"""A suite's `control` section, expanded into control cells and what each one runs.

    control:
      seconds: 14                    # length of a controlled run (a run may set its own)
      oracle: {configurations: [...], paced: [...], duties: [...], seconds: 2}
      colocated: {duty: 0.3, seconds: 7}
      hot_start: {below_c: 4}        # runs with disturbance hot_start: the limit this far under the preheat's temperature
      warm_start: true               # runs start from what earlier runs learned (flashwatt.control.warm_start)
      pace_cycle_s: 0.25             # runs and oracles pace in whole cycles (flashwatt.control.pacing); default 0
      pace_mix: {low: 0.3, period_s: 0.25}  # runs time-share full duty with duty 0.3 (flashwatt.control.duty_mix)
      runs:
        - {mode: budget, budgets_w: [300, 450, 600]}           # one cell per budget
        - {mode: budget, schedule: [[0, 600], [6, 400], [11, 550]], seconds: 16}
        - {mode: budget, budgets_w: [500], disturbance: colocated, disturbance_at_s: 8}
        - {mode: budget, budgets_w: [650], disturbance: hot_start, disturbance_at_s: 30}   # preheated 30 s
        - {mode: energy, workload: steady, precision: bf16}
        - {mode: energy, precision_tolerance: 0.1}             # cheaper precisions (fp8 from 0.1) may join
      random:                        # generated scenarios (flashwatt.control.scenario_generator)
        seeds: [41]
        count: 20                    # per seed and workload: cells random-41-0 ... random-41-19
        workloads: [steady, stream]
        seconds: 10
        budget_range_w: [250, 650]

Every workload a run drives gets its oracle cell (every static configuration, in one job,
so the runs are judged against static runs on the same kind of GPU in the same suite); a
generated scenario whose shape mix changes needs the oracle of the workload it changes to
as well. The name of a cell says what it does; the rest (lengths, the load's duty, the
oracle's configurations, a generated scenario's whole schedule, tenants and failures) is
the cell's `spec`, recorded with it, so `snakemake -f <record>` reruns exactly that run.
"""
from __future__ import annotations

from typing import Any

from flashwatt.config_error import ConfigError
from flashwatt.control.cell import ControlCell

DEFAULT_SECONDS = 14.0
DEFAULT_ORACLE = {
    "configurations": ["sdpa_default", "sdpa_cudnn", "custom", "custom[ctas66]", "custom[ctas33]",
                       "sdpa_flash", "sdpa_efficient"],
    "paced": ["sdpa_cudnn", "custom"],
    "duties": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2],
    "seconds": 2.0,
}
DEFAULT_COLOCATED = {"duty": 0.3, "seconds": 7.0}
# A run that starts hot (disturbance hot_start, at = seconds of preheat at full duty): the
# temperature limit held alongside its budget is this far under where the preheat left the board.
DEFAULT_HOT_START = {"below_c": 4.0}
DEFAULT_RANDOM = {"seeds": [41], "count": 20, "workloads": ["steady"], "precision": "bf16", "causal": False,
                  "seconds": 10.0, "budget_range_w": [250, 650], "step_w": [50, 300]}


def _random_cells(name: str, section: dict, seed: int, add) -> None:
    """The generated scenarios of `section["random"]`, each with its oracle (and the oracle
    of the workload its shape mix changes to)."""
    from flashwatt.control.scenario_generator import GeneratorSettings, generate

    where = f"suites.{name}.control.random"
    settings = {**DEFAULT_RANDOM, **section["random"]}
    try:
        generator = GeneratorSettings(seconds=float(settings["seconds"]),
                                      budget_range_w=tuple(float(w) for w in settings["budget_range_w"]),
                                      step_w=tuple(float(w) for w in settings["step_w"]))
    except ValueError as err:
        raise ConfigError(f"config key {where}: {err}") from None
    warm = bool(section.get("warm_start", True))
    for workload in settings["workloads"]:
        for generator_seed in settings["seeds"]:
            for index in range(int(settings["count"])):
                cell = ControlCell(name, workload, settings["precision"], bool(settings["causal"]), "random",
                                   seed=int(generator_seed), index=index)
                scenario = generate(int(generator_seed), index, workload, generator)
                add(cell, {"seconds": scenario["seconds"], "seed": seed, "warm_start": warm, "scenario": scenario},
                    where)
                for group_workload in {workload, *([scenario["mix_change"]["to"]] if scenario["mix_change"] else [])}:
                    yield ControlCell(name, group_workload, cell.precision, cell.causal, "oracle")


def _runs_cells(name: str, section: dict, seed: int) -> dict[ControlCell, dict]:
    from flashwatt.control.configuration import Configuration, ControlError

    where = f"suites.{name}.control"
    oracle = {**DEFAULT_ORACLE, **section.get("oracle", {})}
    for i, label in enumerate(oracle["configurations"]):
        try:
            Configuration.parse(label)
        except ControlError as err:
            raise ConfigError(f"config key {where}.oracle.configurations[{i}]: {err}") from None
    for i, label in enumerate(oracle["paced"]):
        if label not in oracle["configurations"]:
            raise ConfigError(f"config key {where}.oracle.paced[{i}]: {label!r} is not one of "
                                     f"oracle.configurations ({', '.join(oracle['configurations'])})")
    colocated = {**DEFAULT_COLOCATED, **section.get("colocated", {})}
    # every run and oracle of the suite paced alike: a front paced otherwise judges another pacing
    cycle = float(section.get("pace_cycle_s", 0.0))
    # (the runs alone time-share two duties: the oracle's static rows are the points a mix joins)
    mix = section.get("pace_mix")
    if mix and cycle:
        raise ConfigError(f"config key {where}.pace_mix: runs either time-share two duties or pace in cycles "
                          f"(pace_cycle_s {cycle:g}), not both")
    cells: dict[ControlCell, dict] = {}
    origin: dict[ControlCell, str] = {}

    def add(cell: ControlCell, spec: dict, key: str) -> None:
        if cycle:
            spec = {**spec, "pace_cycle_s": cycle}
        if mix and cell.mode != "oracle":
            spec = {**spec, "pace_mix": [float(mix["low"]), float(mix["period_s"])]}
        if cell in cells and cells[cell] != spec:
            raise ConfigError(f"config key {key}: names the same cell as {origin[cell]} ({cell.scenario} of "
                                     f"{cell.group}) with other settings; give each run its own name")
        cells.setdefault(cell, spec)
        origin.setdefault(cell, key)

    for i, run in enumerate(section.get("runs", [])):
        key = f"{where}.runs[{i}]"
        seconds = float(run.get("seconds", section.get("seconds", DEFAULT_SECONDS)))
        if "budgets_w" in run and "schedule" in run:
            raise ConfigError(f"config key {key}: give budgets_w or schedule, not both")
        if run["mode"] == "budget":
            if "schedule" in run:
                schedules = [tuple((int(t), int(w)) for t, w in run["schedule"])]
            elif "budgets_w" in run:
                schedules = [((0, int(w)),) for w in run["budgets_w"]]
            else:
                raise ConfigError(f"config key {key}: mode budget needs budgets_w or schedule")
        else:
            if "budgets_w" in run or "schedule" in run:
                raise ConfigError(f"config key {key}: mode {run['mode']} takes no budgets_w or schedule")
            schedules = [()]
        disturbance = run.get("disturbance", "")
        at = int(run.get("disturbance_at_s", 0))
        if disturbance == "hot_start" and at <= 0:
            raise ConfigError(f"config key {key}.disturbance_at_s: hot_start needs the seconds of preheat (> 0)")
        if disturbance and disturbance != "hot_start" and not 0 < at < seconds:
            raise ConfigError(f"config key {key}.disturbance_at_s: {at} s must fall inside the run's "
                                     f"{seconds:g} s")
        for budgets in schedules:
            if budgets and budgets[-1][0] >= seconds:
                raise ConfigError(f"config key {key}.schedule: a step at {budgets[-1][0]} s falls outside "
                                         f"the run's {seconds:g} s")
            try:
                cell = ControlCell(name, run.get("workload", "steady"), run.get("precision", "bf16"),
                                   bool(run.get("causal", False)), run["mode"], budgets, disturbance, at,
                                   run.get("max_slowdown_pct"))
            except ValueError as err:
                raise ConfigError(f"config key {key}: {err}") from None
            spec: dict[str, Any] = {"seconds": seconds, "seed": seed, "warm_start": bool(section.get("warm_start", True))}
            if run.get("precision_tolerance") is not None:
                spec["precision_tolerance"] = float(run["precision_tolerance"])
            if disturbance == "colocated":
                spec["colocated"] = colocated
            if disturbance == "hot_start":
                spec["hot_start"] = {**DEFAULT_HOT_START, **section.get("hot_start", {})}
            add(cell, spec, key)
            oracle_cell = ControlCell(name, cell.workload, cell.precision, cell.causal, "oracle")
            add(oracle_cell, {"seed": seed, "oracle": oracle}, f"{where}.oracle")
    if section.get("random"):
        for oracle_cell in list(_random_cells(name, section, seed, add)):
            add(oracle_cell, {"seed": seed, "oracle": oracle}, f"{where}.oracle")
    return cells


def control_runs(config: dict, suite: str) -> dict[ControlCell, dict]:
    """Each control cell of the suite and its spec (plain data: Snakemake compares it between
    runs), in a stable order; empty for a suite without a control section."""
    section = config["suites"][suite].get("control")
    if not section:
        return {}
    seed = int({**config.get("measure", {}), **config["suites"][suite].get("measure", {})}.get("seed", 0))
    cells = _runs_cells(suite, section, seed)
    return {cell: cells[cell] for cell in sorted(cells)}
