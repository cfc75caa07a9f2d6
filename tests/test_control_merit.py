"""Figures of merit of a controlled run that the GPU tests read: when exploration ended, and
the power an independent reader measured while the controller held its fallback."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flashwatt.control.metrics import run_merit
from flashwatt.control.study import fallback_power


def ticks(phases: list[str], dt: float = 0.05, watts: float = 300.0) -> pd.DataFrame:
    t = np.arange(len(phases)) * dt
    return pd.DataFrame({"t": t, "phase": phases, "config": "custom", "tokens": 1000, "duty": 1.0,
                         "budget_w": 450.0, "power_w": watts, "energy_mj": t * watts * 1e3})


def test_a_run_without_exploration_ended_it_at_zero():
    """A warm-started or static run never explores: its exploration ended at 0 s, and its
    steady figures cover the whole run."""
    merit = run_merit(ticks(["hold"] * 60))
    assert merit["explore_s"] == 0.0
    assert merit["steady_tokens_per_s"] == pytest.approx(merit["tokens_per_s"], rel=0.05)
    explored = run_merit(ticks(["explore"] * 20 + ["hold"] * 40))
    assert explored["explore_s"] == pytest.approx(19 * 0.05)


def test_fallback_power_reads_the_last_reading_inside_the_stretch():
    """The reader runs every 0.1 s, so the last ticks of a fallback stretch can come after its
    last reading: the power is taken between the readings the stretch holds."""
    trace = ticks(["hold"] * 20 + ["fallback"] * 60, watts=0.0)
    trace["board_energy_mj"] = trace["t"] * 420.0 * 1e3  # the board draws 420 W throughout
    trace.loc[trace.index[-3:], "board_energy_mj"] = np.nan  # after the reader stopped
    assert fallback_power(trace) == pytest.approx(420.0)
    trace["board_energy_mj"] = np.nan
    assert fallback_power(trace) is None


def test_the_front_ratio_splits_into_the_budget_drawn_and_the_front_at_the_watts_drawn():
    """A phase at 500 W under a 600 W budget, 100 tokens/s: the front (the line between static
    rows at 400 W, 100 tokens/s and 600 W, 200 tokens/s) gives 200 tokens/s at the budget and
    150 at the power drawn, so vs_front 0.5 is 5/6 of the budget drawn, at 2/3 of the front
    there. The tick at the run's start, which covers the time before it, is left out; a phase
    the counter covered too little of has no power."""
    from flashwatt.control.scenario_merit import ScenarioFacts, scenario_merit
    from flashwatt.control.summary import front_split, vs_front

    trace = ticks(["hold"] * 21, dt=0.1, watts=500.0)
    trace["budget_w"], trace["tokens"] = 600.0, 10
    (phase,) = scenario_merit(trace, ScenarioFacts(idle_w=100.0))["front_basis"]
    assert (phase["seconds"], phase["avg_power_w"], phase["avg_budget_w"]) == pytest.approx((2.0, 500.0, 600.0))
    oracle = pd.DataFrame({"config": ["a", "b"], "duty": [1.0, 1.0], "avg_power_w": [400.0, 600.0],
                           "tokens_per_s": [100.0, 200.0], "check_passed": [True, True]})
    ratio, _ = vs_front([phase], oracle, 100.0)
    drawn, at_drawn = front_split([phase], oracle, 100.0)
    assert (ratio, drawn, at_drawn) == pytest.approx((0.5, 5 / 6, 2 / 3))
    gap = trace.copy()
    gap.loc[3:8, "energy_mj"] = np.nan  # NVML gave no counter for 0.6 s of 2.1
    (phase,) = scenario_merit(gap, ScenarioFacts(idle_w=100.0))["front_basis"]
    assert phase["avg_power_w"] is None and front_split([phase], oracle, 100.0) == (None, None)


def test_a_runs_first_second_is_kept_apart_for_the_warm_start_promise():
    """The first second as the front's basis has it, and whether its first window was within
    budget + 3%; a tenant in the first half second leaves it unjudged."""
    from flashwatt.control.scenario_merit import ScenarioFacts, scenario_merit

    trace = ticks(["hold"] * 31, dt=0.1, watts=610.0)
    trace["budget_w"], trace["tokens"] = 600.0, 10
    merit = scenario_merit(trace, ScenarioFacts(idle_w=100.0))
    (phase,) = merit["first_second_basis"]
    assert phase["seconds"] == pytest.approx(1.0) and phase["tokens"] == 100  # the ticks at 0.1-1.0 s
    assert merit["first_window_within"] is True  # 610 W under 600 W + 3 %
    trace["energy_mj"] = trace["t"] * 640.0 * 1e3
    assert scenario_merit(trace, ScenarioFacts(idle_w=100.0))["first_window_within"] is False
    tenant = {"start_s": 0.5, "seconds": 2.0, "alone_w": 300.0}
    assert scenario_merit(trace, ScenarioFacts(idle_w=100.0, tenants=[tenant]))["first_second_basis"] is None


def test_a_run_whose_first_tick_reads_a_moment_before_its_clock_starts_has_its_first_second_judged():
    """On a GPU the controller's first tick came 0.3 ms before the run's clock started: the tick
    after it covers the run's first 0.1 s, and the first second is judged over all of it."""
    from flashwatt.control.scenario_merit import ScenarioFacts, scenario_merit

    trace = ticks(["hold"] * 51, dt=0.1, watts=500.0)
    trace["t"] = trace["t"] - 3e-4
    trace["budget_w"], trace["tokens"] = 600.0, 10
    merit = scenario_merit(trace, ScenarioFacts(idle_w=100.0))
    (phase,) = merit["first_second_basis"]
    assert phase["seconds"] == pytest.approx(1.0) and phase["tokens"] == 100
    (whole,) = merit["front_basis"]
    assert whole["seconds"] == pytest.approx(5.0)
