"""The control suite's side of the pipeline: control cells and their names, the `control`
section of a suite, the job without a GPU, the tables that judge each run against its
oracle, and the figures drawn from them.

Records are made the way the job makes them, from the real governor driving the simulated
GPU of tests/control_plant.py; only the GPU is simulated.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from control_plant import CTAS33, CUDNN, CUSTOM, FLASH, IDLE_W, LIMIT_W, PROFILES, Plant, run
from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.kinds import every_cell
from flashwatt.control.cell import ControlCell
from flashwatt.control.figures import CONTROL_FIGURES, ControlTables
from flashwatt.control.governor import Governor
from flashwatt.control.job import run_control_cell
from flashwatt.kinds import envelope_of
from flashwatt.control.metrics import run_merit
from flashwatt.control.suite import control_runs
from flashwatt.control.summary import pareto_front, runs_table, traces_table
from flashwatt.records import write_record, write_trace


# ---- cells -------------------------------------------------------------------------------
CELLS = [
    ControlCell("s", mode="oracle"),
    ControlCell("s", budgets=((0, 450),)),
    ControlCell("s", "stream", "fp16", True, budgets=((0, 600), (6, 400), (11, 550))),
    ControlCell("s", mode="energy"),
    ControlCell("s", mode="energy", max_slowdown_pct=5),
    ControlCell("s", budgets=((0, 500),), disturbance="colocated", disturbance_at_s=8),
    ControlCell("s", "steady", "fp32", budgets=((0, 450),), disturbance="nvml_failure", disturbance_at_s=5),
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.scenario)
def test_a_control_cell_is_found_again_from_its_path(cell):
    assert ControlCell.from_path(cell.path) == cell
    assert ControlCell.from_path("/anywhere/else/" + cell.path) == cell
    assert cell.path == f"results/cells/s/control/{cell.group}/{cell.scenario}.json"
    assert cell.trace_path.endswith(".trace.parquet") and cell.log_path.startswith("results/logs/cells/s/control/")


def test_control_cell_names_say_what_runs():
    assert [c.scenario for c in CELLS] == [
        "oracle", "budget-450w", "budget-600w-400w_at6s-550w_at11s", "energy", "energy-slowdown5pct",
        "budget-500w-colocated_at8s", "budget-450w-nvml_failure_at5s"]
    assert CELLS[2].group == "stream-fp16-causal"
    assert CELLS[2].as_row()["budget_schedule"] == "600W@0s 400W@6s 550W@11s"


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "budget"}, "needs a budget"),
    ({"mode": "energy", "budgets": ((0, 400),)}, "takes no budget"),
    ({"budgets": ((1, 400),)}, "first step at 0 s"),
    ({"budgets": ((0, 400), (5, 300), (5, 350))}, "increasing times"),
    ({"mode": "oracle", "disturbance": "colocated", "disturbance_at_s": 3}, "not in the oracle"),
    ({"budgets": ((0, 400),), "max_slowdown_pct": 5}, "energy mode only"),
    ({"workload": "bursty", "mode": "energy"}, "workload='bursty'"),
    ({"precision": "int8", "mode": "energy"}, "precision='int8'"),
])
def test_a_control_cell_that_cannot_run_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ControlCell("s", **kwargs)


@pytest.mark.parametrize("path", ["results/cells/s/control/steady-bf16-full/budget-450.json",
                                  "results/cells/s/control/steady-int8-full/energy.json",
                                  "results/cells/s/naive/fp32/L32-B2-H2-D16-full-fwd.json"])
def test_a_path_that_is_not_a_control_cell_is_refused(path):
    with pytest.raises(ValueError, match="is not a ControlCell record"):
        ControlCell.from_path(path)


# ---- the suite's control section ---------------------------------------------------------
def config_with(section: dict) -> dict:
    return validate_config({"suites": {"ctl": {"control": section}}})


def test_the_shipped_control_suite_expands_to_one_cell_per_run_and_an_oracle_per_workload():
    config = load_config("config/config.yaml")
    cells = control_runs(config, "control")
    scenarios = {(c.group, c.scenario) for c in cells}
    budgets = {f"budget-{w}w" for w in range(300, 651, 50)}
    assert {s for g, s in scenarios if g == "steady-bf16-full"} >= budgets | {"oracle", "energy"}
    assert ("stream-bf16-full", "oracle") in scenarios and ("stream-bf16-full", "budget-450w") in scenarios
    assert all(spec["seconds"] > 0 for c, spec in cells.items() if c.mode != "oracle")
    assert every_cell(config, "control") == list(cells)
    assert control_runs(config, "smoke") == {}


def test_what_a_name_does_not_say_travels_in_the_spec():
    config = config_with({"seconds": 9, "colocated": {"duty": 0.5},
                          "runs": [{"mode": "budget", "budgets_w": [500], "disturbance": "colocated",
                                    "disturbance_at_s": 4}, {"mode": "energy", "seconds": 12}]})
    cells = control_runs(config, "ctl")
    colocated = ControlCell("ctl", budgets=((0, 500),), disturbance="colocated", disturbance_at_s=4)
    assert cells[colocated] == {"seconds": 9.0, "seed": 0, "warm_start": True,
                                "colocated": {"duty": 0.5, "seconds": 7.0}}
    assert cells[ControlCell("ctl", mode="energy")]["seconds"] == 12.0
    oracle = cells[ControlCell("ctl", mode="oracle")]["oracle"]
    assert "sdpa_default" in oracle["configurations"] and oracle["seconds"] > 0


@pytest.mark.parametrize("section, message", [
    ({"runs": [{"mode": "budget"}]}, r"runs\[0\]: mode budget needs budgets_w or schedule"),
    ({"runs": [{"mode": "energy", "budgets_w": [400]}]}, r"runs\[0\]: mode energy takes no budgets_w"),
    ({"runs": [{"mode": "budget", "budgets_w": [400], "schedule": [[0, 400]]}]}, "not both"),
    ({"runs": [{"mode": "budget", "schedule": [[0, 600], [20, 400]]}]}, r"schedule: a step at 20 s falls outside"),
    ({"runs": [{"mode": "budget", "schedule": [[2, 600]]}]}, "first step at 0 s"),
    ({"runs": [{"mode": "budget", "budgets_w": [400], "disturbance": "colocated", "disturbance_at_s": 30}]},
     r"disturbance_at_s: 30 s must fall inside"),
    ({"runs": [{"mode": "budget", "budgets_w": [400]}, {"mode": "budget", "budgets_w": [400], "seconds": 5}]},
     r"runs\[1\]: names the same cell as suites.ctl.control.runs\[0\]"),
    ({"oracle": {"configurations": ["sdpa_cudnn", "custom[ctas66]", "triton"]}, "runs": [{"mode": "energy"}]},
     r"oracle.configurations\[2\]: backend 'triton'"),
    ({"oracle": {"configurations": ["sdpa_cudnn"], "paced": ["custom"]}, "runs": [{"mode": "energy"}]},
     r"oracle.paced\[0\]: 'custom' is not one of oracle.configurations"),
    ({"runs": [{"mode": "oracle"}]}, r"runs\[0\].mode: 'oracle' is not allowed"),
    ({"runs": [{"mode": "energy", "budget": 3}]}, r"runs\[0\]: unknown key\(s\) 'budget'"),
    ({"runs": []}, "runs"),
])
def test_a_bad_control_section_names_its_key(section, message):
    with pytest.raises(ConfigError, match=message):
        config_with(section)


# ---- the job without a GPU ---------------------------------------------------------------
def test_without_a_gpu_a_control_cell_is_skipped_with_the_reason_and_the_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    outcome = run_control_cell(ControlCell("s", budgets=((0, 450),)), {"seconds": 1.0, "seed": 0})
    record = outcome.record
    assert record["status"] == "skipped" and "CUDA GPU" in record["reason"]
    assert record["device"]["type"] == "cpu" and record["cell"]["scenario"] == "budget-450w"
    assert record["spec"] == {"seconds": 1.0, "seed": 0} and outcome.trace == []


# ---- tables and figures from records the job's way -----------------------------------------
ORACLE_DUTIES = (1.0, 0.8, 0.6, 0.4, 0.2)
# A row that would win every comparison if its failed float64 check were ignored.
WRONG_BUT_FAST = {"config": "sdpa_flash", "duty": 0.5, "tokens_per_s": 50e6, "avg_power_w": 250.0,
                  "j_per_token": 5e-6, "check_passed": False, "check_rel_err": 0.4}


def oracle_rows(plant: Plant) -> list[dict]:
    rows = []
    statics = [(c, (ORACLE_DUTIES if c in (CUDNN, CUSTOM) else (1.0,))) for c in (CUDNN, CUSTOM, CTAS33, FLASH)]
    for config, duties in statics:
        for duty in duties:
            tokens, power = plant.throughput(config, duty, 0), plant.target_w(config, duty, 0)
            rows.append({"config": config.label, "duty": duty, "tokens_per_s": tokens, "avg_power_w": power,
                         "j_per_token": power / tokens, "check_passed": True, "check_rel_err": 2e-3})
    default = dict(rows[0], config="sdpa_default")  # PyTorch's own choice is cuDNN here
    # the closing repeat of the first row, on a warmer card; fast, to tempt a comparison
    repeat = dict(default, avg_power_w=default["avg_power_w"] * 1.03, tokens_per_s=40e6, j_per_token=1e-6, repeat=True)
    return [default, *rows, WRONG_BUT_FAST, repeat]


def device(uuid: str) -> dict:
    return {"type": "cuda", "name": "Simulated H100", "uuid": uuid}


def write_suite(root, suite="s", run_uuid="GPU-1", oracle_uuid="GPU-1", budgets=(300, 450, 650)) -> list[str]:
    """Record files of one suite: the oracle, a run per budget, a budget schedule and an
    energy run, each as the job writes it."""
    plant = Plant(PROFILES)
    paths = []
    oracle = ControlCell(suite, mode="oracle")
    record = envelope_of(oracle, {"oracle": {}}) | {"status": "ok", "device": device(oracle_uuid),
                                                     "oracle": oracle_rows(plant)}
    write_record(root / oracle.path, record)
    write_trace(root / oracle.trace_path, [])
    paths.append(str(root / oracle.path))
    runs = [ControlCell(suite, budgets=((0, b),)) for b in budgets]
    runs += [ControlCell(suite, budgets=((0, 600), (8, 400))), ControlCell(suite, mode="energy")]
    for cell in runs:
        gov = Governor(cell.mode, list(PROFILES), budget_w=cell.budget_w, idle_w=IDLE_W, limit_w=LIMIT_W)
        # (a quiet board: these tests are of the tables, and a settling time judged on a 0.5 s
        # average of instant readings needs readings steadier than the H100's)
        quiet = Plant(PROFILES, sensor_noise=0.0, noise_w=6.0, ripple=0.0, wander=0.0)
        trace = run(gov, quiet, 16.0,
                    budget_schedule=[(float(t), float(w)) for t, w in cell.budgets[1:]])
        trace["energy_mj"] = trace["true_energy_mj"]
        merit = run_merit(trace) | {"check_passed": True, "check_rel_err": 3e-3, "check_tol": 2e-2}
        record = envelope_of(cell, {"seconds": 16.0}) | {"status": "ok", "device": device(run_uuid),
                                                         "merit": merit}
        write_record(root / cell.path, record)
        write_trace(root / cell.trace_path, trace.assign(cell_id=cell.id).to_dict("records"))
        paths.append(str(root / cell.path))
    skipped = ControlCell(suite, budgets=((0, 90),))
    record = envelope_of(skipped, {"seconds": 16.0}) | {
        "status": "skipped", "device": device(run_uuid),
        "reason": "budget 90 W is under this GPU's idle power (120 W)"}
    write_record(root / skipped.path, record)
    write_trace(root / skipped.trace_path, [])
    paths.append(str(root / skipped.path))
    return paths


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    paths = write_suite(root)
    runs, oracle = runs_table(paths)
    return ControlTables(runs, oracle, traces_table(paths))


def usable(oracle: pd.DataFrame) -> pd.DataFrame:
    return oracle[oracle["check_passed"].astype(bool) & ~oracle["repeat"].fillna(False).astype(bool)]


def test_each_budget_run_is_judged_against_the_fastest_static_within_its_budget(tables):
    runs = tables.runs.set_index("scenario")
    for budget in (300, 450, 650):
        run_ = runs.loc[f"budget-{budget}w"]
        within = usable(tables.oracle)
        within = within[within["avg_power_w"] <= budget]
        best = within.loc[within["tokens_per_s"].idxmax()]
        assert run_["best_static"] == f"{best['config']} d{best['duty']:g}"
        assert run_["vs_best_static"] == pytest.approx(run_["tokens_per_s"] / best["tokens_per_s"])
        assert run_["steady_vs_best_static"] == pytest.approx(run_["steady_tokens_per_s"] / best["tokens_per_s"])
        # the governor on the simulated GPU does as well as the best static point, once it has learned
        assert run_["steady_vs_best_static"] > 0.9
    assert "sdpa_flash d0.5" not in set(tables.runs["best_static"].dropna())
    assert "sdpa_flash d0.5" not in set(tables.runs["best_static_j"].dropna())


def test_energy_is_compared_with_the_static_default_and_the_most_frugal_static(tables):
    energy = tables.runs.set_index("scenario").loc["energy"]
    default = tables.oracle[(tables.oracle["config"] == "sdpa_default")].iloc[0]
    assert energy["static_default_j_per_token"] == pytest.approx(default["j_per_token"])
    assert energy["vs_static_default_j"] == pytest.approx(energy["j_per_token"] / default["j_per_token"])
    frugal = usable(tables.oracle).sort_values("j_per_token").iloc[0]
    assert energy["best_static_j_per_token"] == pytest.approx(frugal["j_per_token"])
    assert bool(energy["oracle_same_device"]) is True


def test_a_run_that_did_not_finish_ok_keeps_its_reason_and_gets_no_comparison(tables):
    skipped = tables.runs.set_index("scenario").loc["budget-90w"]
    assert skipped["status"] == "skipped" and "idle power" in skipped["reason"]
    assert pd.isna(skipped["vs_best_static"]) and pd.isna(skipped["tokens_per_s"])


def test_an_oracle_from_another_gpu_is_said_so(tmp_path):
    runs, _ = runs_table(write_suite(tmp_path, run_uuid="GPU-1", oracle_uuid="GPU-2", budgets=(450,)))
    assert not runs.loc[runs["status"] == "ok", "oracle_same_device"].astype(bool).any()


def test_budget_steps_have_their_settling_times_in_the_table(tables):
    steps = tables.runs.set_index("scenario").loc["budget-600w-400w_at8s"]
    assert steps["budget_schedule"] == "600W@0s 400W@8s"
    assert steps["settling_s"] and all(float(s) < 1.5 for s in steps["settling_s"].split())


def test_power_figure_draws_each_ok_run_with_its_budget_and_windows(tables):
    fig = CONTROL_FIGURES["control_power"].render(tables)
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    ok = tables.runs[tables.runs["status"] == "ok"]
    assert len(axes) == len(ok)
    by_title = {ax.get_title().split("\n")[0]: ax for ax in axes}
    assert set(by_title) == {f"steady-bf16-full · {s}" for s in ok["scenario"]}
    ax = by_title["steady-bf16-full · budget-450w"]
    lines = {line.get_label(): line for line in ax.lines}
    assert set(lines["budget"].get_ydata()) == {450.0}
    windows = [label for label in lines if label.startswith("1 s windows")]
    assert windows == ["1 s windows (energy counter)"]
    steps = by_title["steady-bf16-full · budget-600w-400w_at8s"]
    assert set({line.get_label(): line for line in steps.lines}["budget"].get_ydata()) == {600.0, 400.0}
    assert "suite s" in fig._suptitle.get_text() and "6 of 7 cells ok" in fig._suptitle.get_text()


def test_pareto_figure_draws_the_static_front_and_the_controller(tables):
    fig = CONTROL_FIGURES["control_pareto"].render(tables)
    (ax,) = [a for a in fig.axes if a.axison]
    lines = {line.get_label(): line for line in ax.lines}
    front = lines["Pareto front of static runs"]
    x, y = front.get_xdata(), front.get_ydata()
    assert list(x) == sorted(x) and list(y) == sorted(y)  # more power only where it buys throughput
    good = usable(tables.oracle)
    assert set(zip(x, y)) <= set(zip(good["avg_power_w"], good["tokens_per_s"] / 1e6))
    assert (50.0 not in y)  # the row that failed its check is not on the front
    from flashwatt.control.summary import front_at

    sharing = lines["time-sharing two static runs"]
    assert list(sharing.get_xdata()) == list(x)
    for budget in (300.0, 450.0, 650.0):  # the line is the bar steady_vs_front judges against
        assert np.interp(budget, sharing.get_xdata(), sharing.get_ydata()) * 1e6 == pytest.approx(
            front_at(tables.oracle, budget))
    crosses = [line for line in ax.lines if line.get_label() == "controller (after exploration)"]
    assert len(crosses) == (tables.runs["status"] == "ok").sum()
    assert {t.get_text() for t in ax.texts} >= {"300 W", "450 W", "650 W", "600 W steps", "energy"}


def test_pareto_front_keeps_only_undominated_points():
    rows = pd.DataFrame({"avg_power_w": [300, 400, 450, 500, 600], "tokens_per_s": [5, 9, 8, 12, 12]})
    assert list(pareto_front(rows)["avg_power_w"]) == [300, 400, 500]


def test_energy_figure_draws_controller_oracle_and_default_against_budget(tables):
    fig = CONTROL_FIGURES["control_energy"].render(tables)
    (ax,) = [a for a in fig.axes if a.axison]
    lines = {line.get_label(): line for line in ax.lines}
    controller = lines["controller (whole run)"]
    assert list(controller.get_xdata()) == [300, 450, 650]  # plain budget runs only, not the schedule
    oracle = lines["oracle: least energy static within budget"]
    good = usable(tables.oracle)
    expected = [good[good["avg_power_w"] <= b]["j_per_token"].min() * 1e6 for b in (300, 450, 650)]
    assert list(oracle.get_ydata()) == pytest.approx(expected)
    assert any(label.startswith("static default") for label in lines)
    assert any(label.startswith("energy mode") for label in lines)


def test_figures_with_nothing_to_draw_say_why(tables):
    runs = tables.runs.copy()
    runs["status"] = "skipped"
    runs["reason"] = "control cells drive a CUDA GPU; none is visible"
    empty = ControlTables(runs, tables.oracle.iloc[:0], tables.traces.iloc[:0])
    for name in CONTROL_FIGURES:
        fig = CONTROL_FIGURES[name].render(empty)
        text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
        assert text.startswith("Nothing to draw."), (name, text)
    power = " ".join(t.get_text() for ax in CONTROL_FIGURES["control_power"].render(empty).axes for t in ax.texts)
    assert "None of the 6 controlled runs finished ok:\n6 skipped: control cells drive a CUDA GPU" in power


def test_a_suite_may_hold_attention_grids_and_control_runs():
    config = copy.deepcopy(load_config("config/config.yaml"))
    config["suites"]["smoke"]["control"] = {"runs": [{"mode": "energy"}]}
    validate_config(config)
    cells = every_cell(config, "smoke")
    assert sum(isinstance(c, ControlCell) for c in cells) == 2 and len(cells) > 2


def test_the_static_front_is_read_between_its_neighbouring_points():
    from flashwatt.control.summary import front_at

    oracle = pd.DataFrame({"config": ["a", "a", "b", "c"], "duty": [1.0, 0.5, 1.0, 1.0],
                           "avg_power_w": [600.0, 400.0, 300.0, 500.0], "tokens_per_s": [12.0, 8.0, 5.0, 7.0],
                           "check_passed": [True, True, True, True]})
    assert front_at(oracle, 500.0) == pytest.approx(10.0)  # between (400, 8) and (600, 12); c is dominated
    assert front_at(oracle, 350.0) == pytest.approx(6.5)
    assert front_at(oracle, 250.0) is None and front_at(oracle, 700.0) == pytest.approx(12.0)


def test_steady_throughput_is_judged_against_the_front_at_the_budget(tables):
    from flashwatt.control.summary import front_at

    run_ = tables.runs.set_index("scenario").loc["budget-450w"]
    front = front_at(tables.oracle, 450.0)
    assert run_["front_tokens_per_s"] == pytest.approx(front) and front >= run_["best_static_tokens_per_s"]
    assert run_["steady_vs_front"] == pytest.approx(run_["steady_tokens_per_s"] / front)


def test_the_oracles_closing_repeat_measures_drift_and_is_never_a_comparison(tables):
    runs = tables.runs[tables.runs["status"] == "ok"]
    assert runs["oracle_drift_pct"].astype(float).round(6).eq(3.0).all()
    assert not runs["best_static_tokens_per_s"].dropna().eq(40e6).any()
    assert not runs["best_static_j_per_token"].dropna().eq(1e-6).any()
    assert (runs["static_default_tokens_per_s"].dropna() < 40e6).all()


# ---- generated scenarios in the tables, the pooled figures and the figures -------------------
def write_generated(root, suite="g", count=6) -> list[str]:
    """Records of generated scenarios as the job writes them (the simulated GPU standing in),
    with the oracle of both workloads."""
    from control_plant import SIM_WORKLOADS, oracle_rows as sim_oracle_rows, simulate
    from flashwatt.control.scenario_generator import GeneratorSettings, generate
    from flashwatt.control.scenario_merit import scenario_merit

    plant, paths = Plant(PROFILES), []
    for name, workload in SIM_WORKLOADS.items():
        oracle = ControlCell(suite, name, mode="oracle")
        record = envelope_of(oracle, {"oracle": {}}) | {"status": "ok", "device": device("GPU-1"),
                                                         "oracle": sim_oracle_rows(plant, workload)}
        write_record(root / oracle.path, record)
        paths.append(str(root / oracle.path))
    for index in range(count):
        cell = ControlCell(suite, "steady", mode="random", seed=41, index=index)
        scenario = generate(41, index, "steady", GeneratorSettings(seconds=10))
        gov = Governor("budget", list(PROFILES), budget_w=scenario["schedule"][0][1], idle_w=IDLE_W, limit_w=LIMIT_W)
        trace, facts = simulate(scenario, gov, "steady", Plant(PROFILES, seed=index))
        facts.phases = [(start, f"{group}-bf16-full") for start, group in facts.phases]  # the groups' names
        merit = run_merit(trace) | scenario_merit(trace, facts) | {
            "check_passed": True, "check_rel_err": 3e-3, "check_tol": 2e-2, "idle_w": IDLE_W,
            "warm_start": {"cache": None, "warm_shapes": WARM_SHAPES[index % 3], "shapes": 2}}
        spec = {"seconds": 10.0, "seed": 0, "warm_start": True, "scenario": scenario}
        write_record(root / cell.path, envelope_of(cell, spec) | {"status": "ok", "device": device("GPU-1"),
                                                                  "merit": merit})
        write_trace(root / cell.trace_path, trace.assign(cell_id=cell.id).to_dict("records"))
        paths.append(str(root / cell.path))
    return paths


# The generated runs' warm starts by index % 3: cold, one of its two shapes known, both known.
WARM_SHAPES = (0, 1, 2)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from flashwatt.control.pooled import pooled_table

    paths = write_generated(tmp_path_factory.mktemp("generated"))
    runs, oracle = runs_table(paths)
    tables = ControlTables(runs, oracle, traces_table(paths))
    tables.pooled = pooled_table(runs)  # what write_tables writes beside them
    return tables


def test_each_generated_scenario_is_a_row_with_its_whole_scenario(generated):
    from flashwatt.control.budget_schedule import BudgetSchedule
    from flashwatt.control.scenario_generator import GeneratorSettings, classes, generate

    runs = generated.runs.set_index("scenario")
    assert sorted(runs.index) == [f"random-41-{i}" for i in range(6)]
    for index in range(6):
        row, scenario = runs.loc[f"random-41-{index}"], generate(41, index, "steady", GeneratorSettings(seconds=10))
        assert row["schedule"] == BudgetSchedule.parse(scenario["schedule"]).describe()
        assert row["scenario_classes"] == ",".join(classes(scenario))
        assert row["budget_w"] == scenario["schedule"][0][1] and row["random_seed"] == 41
        assert pd.notna(row["tenants"]) == bool(scenario["tenants"])
        if scenario["tenants"]:
            assert "alone:" in row["tenants"]  # with the tenants' power measured alone
        assert pd.notna(row["mix_change"]) == bool(scenario["mix_change"])
        assert 0.5 < row["vs_front"] < 1.2 and row["front_tokens"] > 0  # judged against the static front
        # ... in two: the budget it drew, and what it made of the watts it drew
        assert 0.8 < row["budget_drawn"] <= 1.03 and 0.5 < row["vs_front_at_drawn"] < 1.2
        assert pd.isna(row["best_static"])  # a moving budget has no one best static row


def test_the_pooled_rows_say_which_targets_are_met(generated):
    pooled = generated.pooled
    steady = pooled[(pooled["group"] == "steady-bf16-full") & (pooled["runs_set"] == "generated")].iloc[0]
    runs = generated.runs
    assert steady["runs"] == 6 and steady["windows"] == runs["windows"].sum()
    expected = (runs["windows_within_pct"] * runs["windows"]).sum() / runs["windows"].sum()
    assert steady["windows_within_pct"] == pytest.approx(expected)
    assert steady["steps"] == sum(len(str(t).split()) for t in runs["step_settle_s"].dropna())
    assert "windows pooled >= 99%" in steady["judged"] and "energy within 3%" not in steady["judged"]
    assert 0.8 < steady["budget_drawn"] <= 1.03 and 0.5 < steady["vs_front_at_drawn"] < 1.2
    from flashwatt.control.pooled import _judge

    bad = _judge(dict(steady, windows_within_pct=90.0, min_windows_within_pct=80.0))
    assert "windows pooled >= 99%" in bad["unmet"] and "windows each >= 95%" in bad["unmet"]
    from flashwatt.control.pooled import report_sentences

    assert "steady-bf16-full: 6 budget runs" in report_sentences(pooled)
    assert f"{steady['budget_drawn']:.3f} of the budget drawn, at {steady['vs_front_at_drawn']:.3f} of the front" \
        in report_sentences(pooled)


def test_the_runs_that_started_warm_are_pooled_apart(generated):
    """A pooled row over the generated runs whose every shape was known from earlier runs (what
    a warm start promises), beside the row of all of them; the report says how many."""
    from flashwatt.control.pooled import STARTED_WARM, _pool, report_sentences

    pooled, runs = generated.pooled, generated.runs
    warm_runs = runs[(runs["mode"] == "random") & (runs["warm_shapes"] == 2)]
    assert sorted(warm_runs["scenario"]) == ["random-41-2", "random-41-5"]
    row = pooled[(pooled["group"] == "steady-bf16-full") & (pooled["runs_set"] == STARTED_WARM)].iloc[0]
    expected = _pool(warm_runs, warm_runs.iloc[:0])
    assert row["runs"] == 2 and row["windows"] == expected["windows"]
    assert row["vs_front"] == pytest.approx(expected["vs_front"])
    assert "energy within 3%" not in row["judged"]
    # ... and judged on what a warm start promises, its first second (the other rows are not)
    assert row["first_windows"] == 2 and row["min_first_second_vs_front"] == pytest.approx(
        warm_runs["first_second_vs_front"].min())
    assert "warm first second >= 0.95 of front" in row["judged"] and "warm first windows within" in row["judged"]
    generated_row = pooled[(pooled["group"] == "steady-bf16-full") & (pooled["runs_set"] == "generated")].iloc[0]
    assert "warm first second" not in generated_row["judged"]
    assert "Of its 6 generated runs, 2 started warm" in report_sentences(pooled)
    assert f"their first second {row['first_second_vs_front']:.3f} of the front" in report_sentences(pooled)
    # a record that does not say how many shapes it met is not taken for a warm one
    from flashwatt.control.pooled import pooled_table

    older = pooled_table(runs.drop(columns=["shapes"]))
    assert (older["runs_set"] != STARTED_WARM).all()


def test_the_scenarios_figure_draws_every_run_against_its_targets(generated):
    fig = CONTROL_FIGURES["control_scenarios"].render(generated)
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == 3
    assert len(axes[0].patches) == 6  # one bar per generated scenario
    assert [t.get_text().split(" (")[0] for t in axes[0].get_yticklabels()] == [f"random-41-{i}" for i in range(6)]
    assert "pooled" in axes[1].get_title() and "not met" in axes[1].get_title()


def test_a_generated_scenario_becomes_the_run_it_names():
    from flashwatt.control.job import scenario_of
    from flashwatt.control.scenario_generator import GeneratorSettings, generate

    config = validate_config({"suites": {"g": {"control": {"random": {"count": 5}}}}})
    cells = control_runs(config, "g")
    for cell, spec in cells.items():
        if cell.mode != "random":
            continue
        run_ = scenario_of(cell, spec)
        generated_ = generate(41, cell.index, "steady", GeneratorSettings())
        assert run_.schedule == tuple(tuple(c) for c in generated_["schedule"]) and run_.mode == "budget"
        assert [t.as_spec() for t in run_.tenants] == generated_["tenants"]
        assert [list(s) for s in run_.nvml_failures] == generated_["nvml_failures"]
        assert (run_.mix_change is not None) == bool(generated_["mix_change"])
        if run_.mix_change:
            assert run_.mix_change[1].kind == "stream" and run_.mix_change[0] == generated_["mix_change"]["at_s"]
    fixed = scenario_of(ControlCell("g", budgets=((0, 500),), disturbance="colocated", disturbance_at_s=8),
                        {"seconds": 16, "colocated": {"duty": 0.3, "seconds": 7}})
    assert [t.as_spec() for t in fixed.tenants] == [{"kind": "gemm", "intensity": 0.3, "start_s": 8.0, "seconds": 7.0}]
    failing = scenario_of(ControlCell("g", budgets=((0, 450),), disturbance="nvml_failure", disturbance_at_s=5),
                          {"seconds": 9})
    assert failing.nvml_failures == ((5.0, float("inf")),)


def test_an_oracle_warms_the_card_before_its_first_row(monkeypatch):
    """The oracle's first configuration runs ORACLE_WARMUP_S at full duty, unrecorded and off
    the warm-start cache, before the first row; then every row in order and the first again
    (its repeat), each paced as the oracle is."""
    from flashwatt.control import study
    from flashwatt.control.workloads import Workload

    calls = []

    def fake_run(scenario, telemetry, device, idle_w=None, cache="default", started=None):
        calls.append((scenario.configuration, scenario.duty, scenario.seconds, scenario.pace_cycle_s, cache))
        return {"tokens_per_s": 1.0, "avg_power_w": 400.0, "j_per_token": 400.0, "check_passed": True,
                "check_rel_err": 1e-3}, None

    monkeypatch.setattr(study, "run_scenario", fake_run)
    table = study.oracle(Workload(), None, "cpu", ["sdpa_cudnn", "custom"], {"sdpa_cudnn": [1.0, 0.5]}, 2.0, 120.0,
                         pace_cycle_s=0.25)
    assert calls[0] == ("sdpa_cudnn", 1.0, study.ORACLE_WARMUP_S, 0.25, None)
    assert [c[:3] for c in calls[1:]] == [("sdpa_cudnn", 1.0, 2.0), ("sdpa_cudnn", 0.5, 2.0), ("custom", 1.0, 2.0),
                                          ("sdpa_cudnn", 1.0, 2.0)]
    assert len(table) == 4 and list(table["repeat"]) == [False, False, False, True]


def test_an_oracle_hands_back_each_rows_trace(monkeypatch):
    """Each recorded row's ticks come back (the warm-up's do not), named as the row, so the
    cell's trace file shows the watts of every static row beside the runs they judge."""
    from flashwatt.control import study
    from flashwatt.control.workloads import Workload

    def fake_run(scenario, telemetry, device, idle_w=None, cache="default", started=None):
        trace = pd.DataFrame({"t": [0.0, 0.1], "power_w": [100.0 * scenario.duty, 100.0 * scenario.duty]})
        return ({"tokens_per_s": 1.0, "avg_power_w": 400.0, "j_per_token": 400.0, "check_passed": True,
                 "check_rel_err": 1e-3}, trace.assign(scenario=scenario.name))

    monkeypatch.setattr(study, "run_scenario", fake_run)
    traces: list = []
    study.oracle(Workload(), None, "cpu", ["sdpa_cudnn"], {"sdpa_cudnn": [1.0, 0.5]}, 2.0, 120.0, traces=traces)
    frame = pd.concat(traces)
    assert list(frame.groupby("scenario", sort=False).size().index) == ["static sdpa_cudnn d1", "static sdpa_cudnn d0.5"]
    assert list(frame["repeat"]) == [False, False, False, False, True, True]
    assert frame.groupby("scenario")["power_w"].max().to_dict() == {"static sdpa_cudnn d1": 100.0,
                                                                    "static sdpa_cudnn d0.5": 50.0}
