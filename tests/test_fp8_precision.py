"""The fp8 precision around the kernel, on the CPU: refusals, the registry, the suites, the cell's
check and parts, the precision ladder, the scheduler's rung and the benchmark's fp8 rows."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.kernels import registry
from flashwatt.kernels.call import AttentionCall
from flashwatt.kernels.custom_fp8 import fp8_refusal
from flashwatt.kernels.custom_variants import HOPPER_MATH, TILES, WGMMA_FP8, parse_variant
from flashwatt.vocabulary import PRECISIONS, STORED_AS, TOLERANCE

CPU = torch.device("cpu")


def fp8_call(**kw):
    return AttentionCall(**{"precision": "fp8", "seq_len": 1024, "batch": 2, "heads": 8, "head_dim": 128, **kw})


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("cap", [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)])
def test_fp8_is_refused_off_hopper_naming_the_capability(cap):
    reason = fp8_refusal(cap, 128)
    assert reason is not None and "\n" not in reason
    assert "compute capability 9.0" in reason and f"this device has {cap[0]}.{cap[1]}" in reason
    with pytest.raises(ValueError, match=rf"wgmma\.e4m3, built only for compute capability 9\.0 \(device has {cap[0]}"):
        parse_variant("wgmma_fp8_m128_n128_s2", "fp8", 128, cap)


def test_fp8_runs_on_hopper_at_head_dims_64_and_128_only():
    assert fp8_refusal((9, 0), 64) is None and fp8_refusal((9, 0), 128) is None
    for D in (16, 32, 256):
        assert fp8_refusal((9, 0), D) == f"custom fp8 runs head_dim 64, 128 (asked for {D})"
    for name in ("wgmma_fp8_m128_n128_s2", "wgmma_fp8_pp_m128_n128_s3", ""):
        launch = parse_variant(name, "fp8", 128, (9, 0), 4096, True)
        assert launch.tile.mma == WGMMA_FP8 and launch.tile.block_n == 128
    with pytest.raises(ValueError, match="runs fp8, not bf16"):
        parse_variant("wgmma_fp8_m128_n128_s2", "bf16", 128, (9, 0))
    with pytest.raises(ValueError, match="runs fp16/bf16, not fp8"):
        parse_variant("wgmma_m128_n128_s2", "fp8", 128, (9, 0))


def test_fp8_tiles_fit_the_kernels():
    """kernels/flash_fwd_fp8.cuh (Fp8Shape): 128-key tiles (V^T rows of 128 bytes), 64 q rows per
    warpgroup, O staged through the K/V rings; flash_fwd_fp8_ws.cuh (Fp8WsShape): a producer
    warpgroup beside two consumers, two Q buffers, O staged in a buffer of its own; shared
    memory within 227 KB. The quantisation's blocks are the kernels' own: a K/V tile's keys share
    one scale (KV_BLOCK), a warpgroup's 64 rows one (Q_BLOCK)."""
    from flashwatt.kernels.custom_variants import WS_SCHEDULES
    from flashwatt.kernels.custom_variants import WGMMA_FP8_RSUM
    from flashwatt.kernels.fp8_numerics import KV_BLOCK, Q_BLOCK, VT_EXTRA_ROWS

    fp8 = {name: t for name, t in TILES.items() if "fp8" in t.precisions}
    assert fp8 and all(t.precisions == ("fp8",) and t.mma in HOPPER_MATH for t in fp8.values())
    assert any(t.schedule in WS_SCHEDULES for t in fp8.values())
    for name, t in fp8.items():
        persistent = t.schedule in WS_SCHEDULES
        assert t.block_n == KV_BLOCK == 128 and t.block_m % Q_BLOCK == 0 and Q_BLOCK == 64, name
        assert t.warps == 4 * (t.block_m // 64 + persistent), name
        for D in t.head_dims:
            assert D in (64, 128)
            vrows = D + VT_EXTRA_ROWS if t.mma == WGMMA_FP8_RSUM else D  # V^T slots with the ones under them
            rings, o = t.stages * t.block_n * (D + vrows), t.block_m * D * 2
            smem = (2 * t.block_m * D + rings + o if persistent else t.block_m * D + rings) + 1024
            assert (persistent or rings >= o) and smem <= 227 * 1024, (name, D)


# ---------------------------------------------------------------- registry and vocabulary

def test_only_custom_runs_fp8_and_the_others_say_why():
    assert "fp8" in PRECISIONS and STORED_AS == {"fp8": "bf16"}
    assert TOLERANCE["fp8"]["fwd"] == 0.1 and TOLERANCE["fp8"]["grad"] is None
    runs = [b.name for b in registry.backends() if "fp8" in b.precisions]
    assert runs == ["custom"]
    for b in registry.backends():
        if b.name != "custom":
            reason = b.refusal(fp8_call(), "cuda")
            assert reason is not None and "asked for fp8" in reason, (b.name, reason)
    assert "fp8" not in registry.backend("custom").block.precisions  # the distributed blocks stay 16/32-bit


def test_custom_refuses_fp8_cells_it_cannot_run_before_any_device_work():
    from flashwatt.kernels.custom import Custom

    assert "CUDA" in Custom().supports(fp8_call(), CPU)
    kernel = registry.get_kernel("custom")
    assert "needs a CUDA device" in kernel.supports(fp8_call(), CPU)
    assert kernel.parts is not None  # the fp8 call's parts are timed apart


# ---------------------------------------------------------------- suites

def test_seed_and_sweep_run_fp8_beside_bf16_on_the_same_shapes():
    from flashwatt.attention.suite import suite_cells
    from flashwatt.config import load_config

    config = load_config("config/config.yaml")
    for suite, d128_lengths in (("seed", {4096}), ("sweep", {4096, 8192, 16384})):
        cells = suite_cells(config, suite)
        fp8 = [c for c in cells if c.precision == "fp8"]
        assert fp8 and all(c.kernel == "custom" and c.pass_ == "fwd" for c in fp8), suite
        assert {c.head_dim for c in fp8} == {64, 128}
        assert {c.seq_len for c in fp8 if c.head_dim == 128} == d128_lengths
        shapes = {(c.seq_len, c.batch, c.heads, c.head_dim, c.causal) for c in cells
                  if c.kernel == "custom" and c.precision == "bf16" and not c.variant}
        missing = [c.id for c in fp8 if (c.seq_len, c.batch, c.heads, c.head_dim, c.causal) not in shapes]
        assert not missing, f"{suite}: fp8 cells without a bf16 custom cell of their shape: {missing}"


# ---------------------------------------------------------------- the cell's check and parts

class TwoPrecisions:
    """A kernel whose fp8 output is off by 4 % and whose bf16 output by 0.1 %, on the CPU."""

    def __call__(self, q, k, v, call):
        from flashwatt.measure import reference_attention

        out = reference_attention(q, k, v, call.causal).float()
        return out * (1.04 if call.precision == "fp8" else 1.001)


def test_an_fp8_check_records_the_bf16_error_on_the_same_inputs():
    from flashwatt.measure import check_cell, make_inputs

    cell = Cell("t", "custom", "fp8", 64, 1, 2, 64)
    q, k, v = make_inputs(cell, CPU, 0, 1)[0]
    assert q.dtype == torch.bfloat16  # an fp8 cell's inputs are bf16, as a user hands them over
    check = check_cell(TwoPrecisions(), cell, q, k, v, 64, 0)
    assert check.passed and check.tol == 0.1
    assert check.rel_err == pytest.approx(0.04, rel=1e-3)
    assert check.rel_err_bf16_same_inputs == pytest.approx(0.001, rel=1e-2)
    bf16 = check_cell(TwoPrecisions(), dataclasses.replace(cell, precision="bf16"), q, k, v, 64, 0)
    assert bf16.rel_err_bf16_same_inputs is None


def test_parts_of_a_call_are_timed_apart():
    from flashwatt.attention.job import time_parts
    from flashwatt.settings import MeasureSettings

    class WithParts:
        def parts(self, call, inputs):
            return {"quantize": lambda i: inputs[i % len(inputs)][0] * 2, "attention": lambda i: inputs[0][1] + 1}

    cell = Cell("t", "custom", "fp8", 64, 1, 2, 64)
    inputs = [(torch.ones(4), torch.ones(4))]
    settings = MeasureSettings(warmup_ms=1, min_repeats=3, min_time_ms=1)
    parts = time_parts(WithParts(), cell, inputs, CPU, settings)
    assert set(parts) == {"quantize", "attention"}
    assert all(p["median_ms"] > 0 and p["method"] == "perf_counter" for p in parts.values())
    assert time_parts(object(), cell, inputs, CPU, settings) == {}


# ---------------------------------------------------------------- the precision ladder

def _row(precision, err, ms, joules, same=None, variant=""):
    return {"kernel": "custom", "variant": variant, "precision": precision, "seq_len": 4096, "batch": 4, "heads": 16,
            "head_dim": 128, "causal": False, "pass": "fwd", "status": "ok", "rel_err": err, "tol": TOLERANCE[precision]["fwd"],
            "rel_err_bf16_same_inputs": same, "median_ms": ms, "quantize_ms": None, "tflops": 1.0,
            "energy_per_call_j": joules, "gflops_per_w": 1.0, "device": "NVIDIA H100 80GB HBM3"}


def test_the_ladder_sets_each_precision_beside_bf16():
    from flashwatt.attention.precision_ladder import COLUMNS, precision_ladder

    frame = pd.DataFrame([
        _row("fp8", 0.05, 0.5, 0.3, same=0.004), _row("bf16", 0.004, 1.0, 0.6), _row("fp16", 0.0005, 1.0, 0.62),
        _row("fp8", 0.05, 0.45, 0.28, same=0.004, variant="wgmma_fp8_m128_n128_s2"),  # a launch variant: not the rung
        {**_row("bf16", 0.004, 2.0, 1.0), "seq_len": 1024},  # one precision only: not on the ladder
        {**_row("fp8", 0.5, 0.5, 0.3), "status": "incorrect", "seq_len": 2048},
    ])
    ladder = precision_ladder(frame)
    assert list(ladder.columns) == COLUMNS
    assert ladder["precision"].tolist() == ["fp16", "bf16", "fp8"]
    fp8 = ladder[ladder["precision"] == "fp8"].iloc[0]
    assert fp8["variant"] == "" and fp8["speedup_vs_bf16"] == pytest.approx(2.0)
    assert fp8["energy_vs_bf16"] == pytest.approx(0.5) and fp8["error_vs_bf16"] == pytest.approx(12.5)
    assert ladder[ladder["precision"] == "bf16"].iloc[0]["energy_vs_bf16"] == pytest.approx(1.0)
    assert precision_ladder(frame.iloc[4:5]).empty


def test_the_ladder_table_is_written_with_the_suite(tmp_path):
    from flashwatt.attention.kind import KIND

    assert any(t.key == "ladder" and t.name == "precision_ladder.csv" for t in KIND.tables)


# ---------------------------------------------------------------- the scheduler's rung

def test_fp8_is_a_candidate_only_where_the_tolerance_allows_it():
    from flashwatt.control.configuration import Configuration, candidates, step_allowed

    assert not step_allowed("fp8", None) and not step_allowed("fp8", 0.05) and step_allowed("fp8", 0.1)
    assert step_allowed("bf16", None)  # the other steps: the sampled check alone decides
    for tolerance in (None, 0.01, 0.099):
        assert not any(c.precision == "fp8" for c in candidates("bf16", precision_opt_in=True, tolerance=tolerance))
    offered = [c.label for c in candidates("bf16", precision_opt_in=True, tolerance=0.2) if c.precision == "fp8"]
    assert offered == ["custom fp8", "custom[ctas66] fp8", "custom[ctas33] fp8"]  # only our kernel runs fp8
    assert not any(c.precision == "fp8" for c in candidates("bf16", tolerance=0.2))  # no opt-in, no step
    assert not any(c.precision == "fp8" for c in candidates("fp32", precision_opt_in=True, tolerance=0.2))
    assert Configuration.parse("custom[ctas66] fp8") == Configuration("custom", "ctas66", 1, "fp8")


def test_a_control_run_takes_its_tolerance_from_the_config():
    from flashwatt.config import load_config
    from flashwatt.control.job import _configurations_used, scenario_of
    from flashwatt.control.suite import control_runs

    config = load_config("config/config.yaml")
    config["suites"]["fp8ctl"] = {"control": {"runs": [{"mode": "energy", "precision_tolerance": 0.1},
                                                       {"mode": "budget", "budgets_w": [400]}]}}
    runs = control_runs(config, "fp8ctl")
    energy = next(c for c in runs if c.mode == "energy")
    budget = next(c for c in runs if c.mode == "budget")
    assert runs[energy]["precision_tolerance"] == 0.1 and "precision_tolerance" not in runs[budget]
    assert scenario_of(energy, runs[energy]).precision_tolerance == 0.1
    assert scenario_of(budget, runs[budget]).precision_tolerance is None
    assert "custom fp8" in _configurations_used(energy, runs[energy])
    assert not any("fp8" in label for label in _configurations_used(budget, runs[budget]))


def test_the_schema_takes_a_tolerance_and_refuses_a_bad_one():
    from flashwatt.config import ConfigError, load_config, validate_config

    config = load_config("config/config.yaml")
    config["suites"]["fp8ctl"] = {"control": {"runs": [{"mode": "energy", "precision_tolerance": 0.1}]}}
    validate_config(config)
    config["suites"]["fp8ctl"]["control"]["runs"][0]["precision_tolerance"] = 0
    with pytest.raises(ConfigError, match="precision_tolerance"):
        validate_config(config)


# ---------------------------------------------------------------- the benchmark's fp8 rows

def test_the_benchmark_times_fp8_beside_our_bf16_forward():
    from flashwatt.bench import _parse_arguments, _runs
    from flashwatt.bench_fp8 import PART, fp8_runs, fp8_summary_line

    args, _, _, _ = _parse_arguments(["--dtypes", "fp8", "--head-dims", "128"])
    runs = _runs(args, [], True, "fp8", 128)
    assert runs == fp8_runs(True, 128)
    assert runs[0] == ("sdpa_flash", "", "", "bf16") and ("custom", "", "", "bf16") in runs
    assert ("custom", "", "", "fp8") in runs and ("custom", "", PART + "quantize", "fp8") in runs
    assert {v for k, v, _, p in runs if p == "fp8" and v} == {n for n, t in TILES.items()
                                                             if "fp8" in t.precisions and 128 in t.head_dims}
    d64 = _runs(_parse_arguments(["--dtypes", "fp8", "--head-dims", "64"])[0], [], True, "fp8", 64)
    assert {v for k, v, _, p in d64 if p == "fp8" and v} == {n for n, t in TILES.items() if "fp8" in t.precisions}
    line = fp8_summary_line({"custom": 800.0, "custom:attention": 1000.0, "custom@bf16": 500.0,
                             "custom:quantize": 4000.0, "sdpa_cudnn": 600.0,
                             "custom:wgmma_fp8_ws_pp_m128_n128_s2": 790.0,
                             "custom:wgmma_fp8_ws_pp_m128_n128_s3": 805.0}, (4, 16, 4096, 128, 16), False)
    assert " 1.600 " in line and " 2.000 " in line and " 20.0 " in line  # fp8/bf16, kernel/bf16, quantisation share
    assert "  805.0 ws_pp_s3 " in line  # the best tile's call and its name
    with pytest.raises(SystemExit):
        _parse_arguments(["--dtypes", "fp8", "--pass", "bwd"])


def test_the_cudnn_peer_says_which_module_is_missing(tmp_path, monkeypatch):
    """The bench prints the first 160 characters of a peer's refusal: it starts with what failed,
    the missing module's name and where the package was found."""
    import sys
    from pathlib import Path

    from flashwatt.bench_peers import frontend_refusal

    monkeypatch.delitem(sys.modules, "cudnn", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "cudnn").exists()])
    why = frontend_refusal()
    assert why.startswith("cudnn_fp8: import cudnn failed, ModuleNotFoundError (module 'cudnn')"), why
    assert "no package 'cudnn' on sys.path" in why
    package = tmp_path / "cudnn"
    package.mkdir()
    (package / "__init__.py").write_text("from . import _compiled_module\n")  # the wheel's native part missing
    monkeypatch.syspath_prepend(str(tmp_path))
    why = frontend_refusal()
    assert why.startswith("cudnn_fp8: import cudnn failed, ImportError"), why
    assert f"package at {package / '__init__.py'}" in why
    monkeypatch.delitem(sys.modules, "cudnn", raising=False)
