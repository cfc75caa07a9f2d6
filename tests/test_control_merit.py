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
