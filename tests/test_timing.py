"""flashwatt.timing on the CPU: step sizing, statistics per call, the fallback path."""
from __future__ import annotations

import statistics

import pytest
import torch

from flashwatt.settings import MeasureSettings
from flashwatt.timing import (MAX_CALLS_PER_STEP, MIN_STEP_S, Workload, calls_per_step, per_call_stats,
                              steps_wanted, time_workload)

CPU = torch.device("cpu")


def test_a_step_lasts_about_two_milliseconds():
    assert calls_per_step(40e-6) == 50  # a 40 µs kernel: 50 calls a step
    assert calls_per_step(MIN_STEP_S * 3) == 1  # long calls are timed one by one
    assert calls_per_step(1e-9) == MAX_CALLS_PER_STEP  # bounded: capture time and graph memory
    assert calls_per_step(0) == 1 and calls_per_step(float("nan")) == 1


def test_statistics_are_per_call():
    stats = per_call_stats([0.010, 0.012, 0.011], k=10)  # steps of 10 calls, in seconds
    assert stats["median_ms"] == pytest.approx(1.1)
    assert stats["min_ms"] == pytest.approx(1.0)
    assert stats["p10_ms"] <= stats["median_ms"] <= stats["p90_ms"]


def test_steps_wanted_honours_repeats_and_time():
    s = MeasureSettings(min_repeats=30, min_time_ms=500, max_repeats=2000)
    assert steps_wanted(0.002, s) == 250  # 0.5 s of 2 ms steps
    assert steps_wanted(0.1, s) == 30  # long steps: min_repeats
    assert steps_wanted(1e-7, s) == 2000  # capped


def test_cpu_workload_times_batches_of_calls():
    calls = []
    work = Workload.build(lambda i: calls.append(i) or sum(range(3000)), CPU, per_call_s=1e-4)
    assert work.method == "perf_counter" and work.k == 20
    timing = time_workload(work, MeasureSettings(min_repeats=7, min_time_ms=5))
    assert timing["steps"] >= 7 and timing["repeats"] == timing["steps"] * work.k
    assert timing["calls_per_step"] == 20
    assert 0 < timing["min_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    assert calls[:20] == list(range(20))  # each step walks the input sets from 0
    assert "eager_ms" not in timing  # launch overhead is a GPU figure
    # every timed step's time per call is kept: the cell's repeats a comparison bootstraps
    assert len(timing["per_call_ms"]) == timing["steps"]
    assert statistics.median(timing["per_call_ms"]) == pytest.approx(timing["median_ms"])


def refuses_capture(i: int) -> None:
    raise RuntimeError("this backend refuses graph capture")


def test_capture_failure_falls_back_to_eager_batches_with_the_reason():
    # The capture fails on any machine (without CUDA at its stream, with CUDA at the call):
    # the workload must say so and run eagerly.
    work = Workload.build(refuses_capture, torch.device("cuda"), per_call_s=1e-4)
    assert work.method == "eager_batch"
    assert work.fallback_reason.startswith("graph capture failed:")
    off = Workload.build(lambda i: None, torch.device("cuda"), per_call_s=1e-4, use_graph=False)
    assert off.method == "eager_batch" and "switched off" in off.fallback_reason


def test_settings_refuse_unknown_keys():
    with pytest.raises(ValueError, match="unknown key.*min_repeat"):
        MeasureSettings.from_mapping({"min_repeat": 3})
    s = MeasureSettings.from_mapping({"min_repeats": 3})
    assert s.min_repeats == 3 and MeasureSettings.from_mapping(s) is s
    assert MeasureSettings.from_mapping(s.as_dict()) == s


def test_every_energy_window_takes_its_options_from_the_settings():
    import inspect

    from flashwatt.energy import measure_energy

    s = MeasureSettings(energy_window_s=2.5, idle_settle_s=0.7, idle_window_s=0.4, sampler_period_s=0.05)
    assert s.energy_window() == {"min_window_s": 2.5, "idle_settle_s": 0.7, "idle_window_s": 0.4,
                                 "sampler_period_s": 0.05}
    assert s.energy_window(idle=False) == {"min_window_s": 2.5, "idle_settle_s": 0.0, "idle_window_s": 0.0,
                                           "sampler_period_s": 0.05}
    inspect.signature(measure_energy).bind(None, None, None, **s.energy_window())  # names measure_energy takes
