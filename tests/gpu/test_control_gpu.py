"""The power-aware scheduler on a real GPU with real NVML: two budgets, the energy mode, an
NVML failure, generated scenarios (a co-located tenant, NVML read failures, a change of the
shape mix) and a warm start, each run checked against float64. The control study
(python -m flashwatt.control.bench) and the control_heldout suite hold the full comparison
against the oracle."""
from __future__ import annotations

import pytest
import torch

from flashwatt.control.metrics import window_power
from flashwatt.control.sensor import idle_power
from flashwatt.control.study import run_scenario
from flashwatt.control.workloads import Scenario, Workload
from flashwatt.telemetry import open_telemetry


@pytest.fixture(scope="module")
def board():
    device = torch.device("cuda", torch.cuda.current_device())
    telemetry = open_telemetry([str(torch.cuda.get_device_properties(device).uuid)])
    assert telemetry.available, telemetry.reason
    run_scenario(Scenario("warm-up", Workload(), "static", configuration="custom", seconds=1.0), telemetry, device,
                 cache=None)
    idle = idle_power(telemetry, seconds=1.0)
    yield device, telemetry, idle
    telemetry.close()


@pytest.mark.parametrize("budget", [350.0, 550.0])
def test_budget_is_held_after_exploration(board, budget):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("budget", Workload(), "budget", budget_w=budget, seconds=20.0),
                                telemetry, device, idle, cache=None)  # cold: each budget explores
    assert merit["check_passed"], merit
    after = trace[trace["t"] > merit["explore_s"] + 1.0].reset_index(drop=True)
    windows = window_power(after)
    within = (windows["power_w"] <= budget * 1.03).mean()
    assert within >= 0.9, windows
    assert windows["power_w"].mean() >= 0.85 * budget, windows  # the budget is used, not wasted
    assert (trace["phase"] != "fallback").all()


def test_energy_mode_settles_on_the_cheapest_configuration_it_measured(board):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("energy", Workload(), "energy", seconds=9.0), telemetry, device, idle,
                                cache=None)
    assert merit["check_passed"], merit
    assert (trace["duty"] == 1.0).all()
    assert merit["explore_s"] <= 10.0
    assert merit["final_config"] in ("sdpa_cudnn", "custom", "sdpa_flash", "custom[ctas66]", "custom[ctas33]", "sdpa_efficient")


def test_nvml_failure_falls_back_and_output_stays_correct(board):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("failure", Workload(), "budget", budget_w=450.0, seconds=7.0,
                                         nvml_failures=((4.0, float("inf")),)), telemetry, device, idle,
                                cache=None)
    assert merit["check_passed"], merit
    late = trace[trace["t"] > 5.0]
    assert len(late) and (late["phase"] == "fallback").all()
    assert "injected failure" in " ".join(trace["event"].dropna())
    assert merit["calls"] > 0
    # measured by an independent reader of NVML while the controller's had failed
    assert merit["fallback_observed_w"] is not None and merit["fallback_observed_w"] <= 450.0 * 1.03


def test_control_cells_run_as_the_pipeline_runs_them(board, tmp_path):
    """A control cell's job on the real board: the oracle (two static configurations, one
    paced) and a budget run, written and judged as the workflow does."""
    from flashwatt.control.cell import ControlCell
    from flashwatt.control.job import run_control_cell
    from flashwatt.control.summary import runs_table
    from flashwatt.records import write_record

    oracle_cell = ControlCell("gpu", mode="oracle")
    spec = {"seed": 0, "oracle": {"configurations": ["sdpa_default", "sdpa_cudnn"], "paced": ["sdpa_cudnn"],
                                  "duties": [0.5], "seconds": 1.5}}
    oracle = run_control_cell(oracle_cell, spec).record
    assert oracle["status"] == "ok", oracle
    rows = [r for r in oracle["oracle"] if not r["repeat"]]
    assert [(r["config"], r["duty"]) for r in rows] == [("sdpa_default", 1.0), ("sdpa_cudnn", 1.0), ("sdpa_cudnn", 0.5)]
    (again,) = [r for r in oracle["oracle"] if r["repeat"]]
    assert (again["config"], again["duty"]) == ("sdpa_default", 1.0) and again["check_passed"]
    assert all(r["check_passed"] and r["avg_power_w"] > oracle["idle_w"] for r in rows)
    paced, full = rows[2], rows[1]
    assert paced["avg_power_w"] < full["avg_power_w"] and paced["tokens_per_s"] < 0.7 * full["tokens_per_s"]

    budget_cell = ControlCell("gpu", budgets=((0, 450),))
    outcome = run_control_cell(budget_cell, {"seed": 0, "seconds": 8.0})
    record = outcome.record
    assert record["status"] == "ok", record
    assert record["device"]["type"] == "cuda" and record["idle_w"] > 0
    assert record["merit"]["windows"] >= 6 and len(outcome.trace) >= 60
    assert {row["cell_id"] for row in outcome.trace} == {budget_cell.id}

    for cell, rec in ((oracle_cell, oracle), (budget_cell, record)):
        write_record(tmp_path / cell.path, rec)
    runs, _ = runs_table([tmp_path / oracle_cell.path, tmp_path / budget_cell.path])
    judged = runs.iloc[0]
    assert judged["scenario"] == "budget-450w" and judged["oracle_same_device"]
    assert abs(judged["oracle_drift_pct"]) < 10
    under = [r for r in rows if r["avg_power_w"] <= 450]
    if under:
        best = max(under, key=lambda r: r["tokens_per_s"])
        assert judged["best_static"] == f"{best['config']} d{best['duty']:g}"
        assert judged["vs_best_static"] == pytest.approx(judged["tokens_per_s"] / best["tokens_per_s"])


# Scenarios of seed 41 (the control suite's) holding each class: 2 a co-located tenant and a
# ramp, 3 NVML read failures and a ramp, 4 a tenant and a change to the mixed shapes.
@pytest.mark.parametrize("index", [2, 3, 4])
def test_generated_scenarios_hold_their_budget(board, index, tmp_path):
    from flashwatt.control.cell import ControlCell
    from flashwatt.control.job import scenario_of
    from flashwatt.control.scenario_generator import GeneratorSettings, classes, generate

    device, telemetry, idle = board
    generated = generate(41, index, "steady", GeneratorSettings(seconds=8.0))
    cell = ControlCell("gpu", mode="random", seed=41, index=index)
    scenario = scenario_of(cell, {"seconds": 8.0, "seed": 0, "scenario": generated})
    merit, trace = run_scenario(scenario, telemetry, device, idle, cache=tmp_path)
    print(index, classes(generated), {k: merit.get(k) for k in (
        "windows", "windows_within_pct", "infeasible_windows", "windows_over_10pct", "sliding_over_10pct",
        "step_settle_s", "front_basis", "tenants", "fallback_observed_w")})
    assert merit["check_passed"], merit
    assert merit["windows"] >= 5 and merit["windows_within_pct"] >= 80.0  # at most one feasible window missed
    assert merit["windows_over_10pct"] == 0
    assert all(s is None or s <= 2.0 for s in merit["step_settle_s"]), merit["step_settle_s"]
    for tenant in merit["tenants"]:  # each tenant's power was measured alone, before the run
        assert tenant["alone_w"] is not None and tenant["alone_w"] > idle
    if generated["nvml_failures"]:
        long_ones = [d for _, d in generated["nvml_failures"] if d > 1.0]
        assert not long_ones or (trace["phase"] == "fallback").any()
        assert trace["board_energy_mj"].notna().sum() > len(trace) // 2  # judged by an independent reader
    if generated["mix_change"]:
        assert merit["warm_start"]["shapes"] > 1  # the stream's shapes joined mid-run


def test_a_warm_started_run_begins_at_its_operating_point(board, tmp_path):
    device, telemetry, idle = board
    cold, _ = run_scenario(Scenario("cold", Workload(), "budget", budget_w=450.0, seconds=8.0), telemetry, device,
                           idle, cache=tmp_path)
    warm, trace = run_scenario(Scenario("warm", Workload(), "budget", budget_w=450.0, seconds=4.0), telemetry, device,
                               idle, cache=tmp_path)
    assert cold["check_passed"] and warm["check_passed"]
    assert cold["warm_start"]["warm_shapes"] == 0 and warm["warm_start"]["warm_shapes"] == 1
    assert (trace["phase"] != "explore").all()
    first = trace[trace["t"] <= 1.0].dropna(subset=["energy_mj"])
    first_w = (first["energy_mj"].iloc[-1] - first["energy_mj"].iloc[0]) / 1e3 / (first["t"].iloc[-1] - first["t"].iloc[0])
    first_tokens_per_s = trace[trace["t"] <= 1.0]["tokens"].sum() / 1.0
    print({"cold_steady_tokens_per_s": cold["steady_tokens_per_s"], "warm_first_second_tokens_per_s": first_tokens_per_s,
           "warm_first_second_w": first_w, "warm_choice": warm["final_config"]})
    assert first_w <= 450.0 * 1.03  # its first second is within the budget
    assert first_tokens_per_s >= 0.9 * cold["steady_tokens_per_s"]  # ... at the operating point the first run reached


def test_a_mix_of_two_duties_is_their_time_sharing_on_the_gpu(board):
    """`pace_mix`: duty 0.65 as full duty half of each 0.25 s period and duty 0.3 the rest
    (flashwatt.control.duty_mix) realizes its busy share as the pacer counts it, read over
    whole periods, and computes at least the tokens per joule of the line between the two
    static points (within 5 %); and a budget holds on it. Where on that line it sits is not
    asserted: on an H200 the mix at a counted 0.67 drew 560 W for 11.9 M tokens/s, the line at
    0.67 445 W for 9.4 M (the same 21.1 k tokens per joule): the calls' GPU time, estimated
    from full duty, is not what they take at duty 0.3 (docs/control.md)."""
    device, telemetry, idle = board
    point = {}
    for duty in (1.0, 0.3):
        merit, _ = run_scenario(Scenario(f"static d{duty}", Workload(), "static", configuration="sdpa_cudnn",
                                         duty=duty, seconds=4.0), telemetry, device, idle, cache=None)
        point[duty] = merit
    merit, trace = run_scenario(Scenario("mixed d0.65", Workload(), "static", configuration="sdpa_cudnn", duty=0.65,
                                         seconds=6.0, pace_mix=(0.3, 0.25)), telemetry, device, idle, cache=None)
    late = trace[trace["t"] > 1.5]
    realized = late["reading_duty"].mean()
    assert late["reading_window_s"].min() >= 0.45 and realized == pytest.approx(0.65, abs=0.05), late.describe()
    share = (realized - 0.3) / 0.7  # of the time at full duty
    line = {key: share * point[1.0][key] + (1 - share) * point[0.3][key] for key in ("tokens_per_s", "avg_power_w")}
    print({"realized": realized, "mix": {key: merit[key] for key in line}, "line": line})
    per_joule = merit["tokens_per_s"] / merit["avg_power_w"]
    assert per_joule >= 0.95 * line["tokens_per_s"] / line["avg_power_w"], (merit, line)
    budget = 450.0
    merit, trace = run_scenario(Scenario("mixed budget", Workload(), "budget", budget_w=budget, seconds=15.0,
                                         pace_mix=(0.3, 0.25)), telemetry, device, idle, cache=None)
    assert merit["check_passed"], merit
    windows = window_power(trace[trace["t"] > merit["explore_s"] + 1.0].reset_index(drop=True))
    assert (windows["power_w"] <= budget * 1.03).mean() >= 0.9, windows
    assert windows["power_w"].mean() >= 0.85 * budget, windows


def test_the_pacers_count_of_busy_time_is_what_nvml_sees(board):
    """The duty the pacer counts (the share of the time it did not sleep) against NVML's own
    utilization (the share of time a kernel ran, sampled by the driver), averaged over the
    last seconds: paced in 2 ms quanta at duty 0.3 and 0.65, and time-sharing full duty with 0.3
    at 0.65 (flashwatt.control.duty_mix). Within a tenth each. (On an H200 the mix at a counted
    0.67 drew the watts of a busy share near 0.8 on the line between the static points, or
    the static duty-0.3 point idled more than it counted: this says which.)"""
    device, telemetry, idle = board
    seen = {}
    for label, duty, mix in (("d0.3", 0.3, None), ("d0.65", 0.65, None), ("mix 0.65", 0.65, (0.3, 0.25))):
        merit, trace = run_scenario(Scenario(label, Workload(), "static", configuration="sdpa_cudnn", duty=duty,
                                             seconds=5.0, pace_mix=mix), telemetry, device, idle, cache=None)
        late = trace[trace["t"] > 2.0]
        counted = late["reading_duty"].mean() if late["reading_duty"].notna().any() else duty
        seen[label] = {"counted": counted, "nvml": late["gpu_util_pct"].mean() / 100.0,
                       "watts": merit["avg_power_w"], "tokens_per_s": merit["tokens_per_s"]}
    print(seen)
    for label, row in seen.items():
        assert row["nvml"] == pytest.approx(row["counted"], abs=0.1), (label, seen)


def test_the_judges_meter_times_the_counters_updates_on_this_board(board):
    """The study's meter of the energy counter (flashwatt.control.counter_meter) on real NVML: it
    sees the counter move about every 0.1 s, and over a steady run its windows agree with the
    controller's reads at its ticks, which differ from it only where the power moves."""
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("metered", Workload(), "static", configuration="sdpa_cudnn", seconds=4.0),
                                telemetry, device, idle, cache=None)
    assert merit["meter_updates"] >= 30, merit
    assert 0.08 <= merit["meter_gap_ms"] / 1e3 <= 0.12, merit
    assert merit["meter_polls"] < 30 * merit["meter_updates"], merit  # it sleeps through most of each gap
    assert merit["meter_unplaced"] <= 0.2 * merit["meter_updates"], merit  # the counter keeps its period
    metered = window_power(trace)
    at_reads = window_power(trace.drop(columns="board_energy_mj"))
    both = metered.merge(at_reads, on="start", suffixes=("_metered", "_reads")).dropna()
    assert len(both) >= 3
    assert ((both["power_w_metered"] / both["power_w_reads"] - 1).abs() < 0.03).all(), both
