"""One cell at a time through the job function on a real GPU with real NVML."""
import pytest
from flashwatt.attention.cell import Cell
from flashwatt.config import load_config
from flashwatt.settings import measure_settings
from flashwatt.attention.job import run_cell

pytestmark = pytest.mark.gpu

SETTINGS = {**measure_settings(load_config(), "seed"), "energy_window_s": 2.0, "idle_settle_s": 0.5}


def cell(kernel, precision="bf16", **kw):
    base = dict(suite="seed", kernel=kernel, precision=precision, seq_len=1024, batch=16, heads=8, head_dim=64)
    return Cell(**{**base, **kw})


def test_ok_cell_has_checked_timing_and_counter_energy():
    out = run_cell(cell("sdpa_flash"), SETTINGS)
    rec = out.record
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["check"]["passed"] and rec["check"]["rel_err"] < 1e-2
    timing = rec["timing"]
    assert timing["method"] == "cuda_graph" and 0 < timing["median_ms"] < 5
    assert timing["repeats"] == timing["steps"] * timing["calls_per_step"]
    assert timing["eager_ms"] > 0 and timing["launch_overhead_ms"] == pytest.approx(timing["eager_ms"] - timing["median_ms"])
    assert abs(timing["timed_vs_window_pct"]) <= 5, timing
    energy = rec["energy"]
    assert energy["available"] and energy["window_s"] >= 2.0 and energy["calls"] > 1000
    # At the power cap or below it, but never below idle: a plausible window, from the counter.
    assert energy["idle_power_w"] < energy["avg_power_w"] <= energy["peak_power_w"] * 1.05
    assert energy["energy_per_call_j"] == pytest.approx(energy["energy_j"] / energy["calls"])
    assert abs(energy["counter_vs_integral_pct"]) < 5
    assert rec["device"]["name"].startswith("NVIDIA") and rec["device"]["nvml"][0]["uuid"]
    assert any(row.get("in_window") for row in out.trace)
    assert 50 <= energy["gpu_util_pct"] <= 100 and energy["mem_util_pct"] is not None


def test_backend_refusal_is_skipped_with_pytorchs_reason():
    rec = run_cell(cell("sdpa_flash", head_dim=512, heads=1), SETTINGS).record
    assert rec["status"] == "skipped"
    assert "PyTorch refused" in rec["reason"] and "512" in rec["reason"]


def test_out_of_memory_is_a_recorded_outcome():
    huge = cell("naive", precision="fp32", seq_len=65536, batch=64)
    rec = run_cell(huge, SETTINGS).record
    assert rec["status"] == "oom" and "out of memory" in rec["reason"]
    # The process is still usable afterwards.
    assert run_cell(cell("naive", seq_len=256, batch=2), {**SETTINGS, "energy": False}).record["status"] == "ok"


def test_fwd_bwd_gradients_are_checked():
    rec = run_cell(cell("sdpa_efficient", pass_="fwd_bwd", seq_len=512), {**SETTINGS, "energy": False}).record
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["check"]["grad_rel_err"] is not None and rec["check"]["grad_rel_err"] < 2e-2

