"""The power-aware scheduler on a real GPU with real NVML: two budgets, the energy mode and
an NVML failure, each run checked against float64. The control study
(python -m flashwatt.control.bench) holds the full comparison against the oracle."""
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
    run_scenario(Scenario("warm-up", Workload(), "static", configuration="custom", seconds=1.0), telemetry, device)
    idle = idle_power(telemetry, seconds=1.0)
    yield device, telemetry, idle
    telemetry.close()


@pytest.mark.parametrize("budget", [350.0, 550.0])
def test_budget_is_held_after_exploration(board, budget):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("budget", Workload(), "budget", budget_w=budget, seconds=16.0),
                                telemetry, device, idle)
    assert merit["check_passed"], merit
    after = trace[trace["t"] > merit["explore_s"] + 1.0].reset_index(drop=True)
    windows = window_power(after)
    within = (windows["power_w"] <= budget * 1.03).mean()
    assert within >= 0.9, windows
    assert windows["power_w"].mean() >= 0.85 * budget, windows  # the budget is used, not wasted
    assert (trace["phase"] != "fallback").all()


def test_energy_mode_settles_on_the_cheapest_configuration_it_measured(board):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("energy", Workload(), "energy", seconds=9.0), telemetry, device, idle)
    assert merit["check_passed"], merit
    assert (trace["duty"] == 1.0).all()
    assert merit["explore_s"] <= 10.0
    assert merit["final_config"] in ("sdpa_cudnn", "custom", "sdpa_flash", "custom[ctas66]", "custom[ctas33]", "sdpa_efficient")


def test_nvml_failure_falls_back_and_output_stays_correct(board):
    device, telemetry, idle = board
    merit, trace = run_scenario(Scenario("failure", Workload(), "budget", budget_w=450.0, seconds=7.0,
                                         fail_telemetry_after_s=4.0), telemetry, device, idle)
    assert merit["check_passed"], merit
    late = trace[trace["t"] > 5.0]
    assert len(late) and (late["phase"] == "fallback").all()
    assert "injected failure" in " ".join(trace["event"].dropna())
    assert merit["calls"] > 0
