"""The kernel benchmark itself on a GPU: a short run checks every custom output against
sdpa_flash before timing it, reports times only for checked outputs, and exits 0."""
from __future__ import annotations

import csv
import math

import pytest
import torch

from flashwatt import bench
from flashwatt.kernels.custom import WGMMA_CAPABILITY


@pytest.mark.nvcc  # the custom kernels are built
def test_short_benchmark_checks_and_times_every_kernel(tmp_path):
    out = tmp_path / "bench.csv"
    rc = bench.main(["--dtypes", "bf16", "--head-dims", "64", "--max-seq-len", "1024", "--min-time-ms", "20",
                     "--rounds", "2", "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    shapes = {(r["batch"], r["seq_len"], r["causal"]) for r in rows}
    assert shapes == {(b, l, c) for b, l in (("32", "512"), ("16", "1024")) for c in ("False", "True")}
    kernels = {r["kernel"] + (":" + r["variant"] if r["variant"] else "") for r in rows}
    assert {"sdpa_flash", "sdpa_cudnn", "custom"} <= kernels
    if torch.cuda.get_device_capability() == WGMMA_CAPABILITY:
        assert any(k.startswith("custom:wgmma") for k in kernels), kernels
    for r in rows:
        assert float(r["tflops"]) > 1.0, r  # every kernel ran and was timed
        assert r["method"] == "cuda_graph", r  # every backend here can be captured
        assert r["rounds"] == "2" and 0 <= float(r["round_spread"]) < 1, r  # timed twice, rotated
        if r["kernel"] == "custom":
            assert float(r["rel_err_vs_flash"]) <= 1e-2, r
        else:
            assert math.isnan(float(r["rel_err_vs_flash"])), r


@pytest.mark.nvcc
def test_backward_alone_and_the_one_section_order_are_timed(tmp_path):
    """--pass bwd times each backend's backward from saved forwards (gradients checked
    first), at 2.5x the forward's FLOPs; --one-l2-section adds the custom kernel in the old
    work order beside the default, --deterministic its deterministic backward."""
    out = tmp_path / "bench.csv"
    rc = bench.main(["--dtypes", "bf16", "--shapes", "4x16x1024x128", "--pass", "bwd", "--one-l2-section",
                     "--deterministic", "--min-time-ms", "20", "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    by_kernel = {(r["kernel"], r["l2_section"] + ("+det" if r["deterministic"] == "True" else ""), r["causal"]): r
                 for r in rows if not r["variant"]}
    for causal in ("False", "True"):
        for key in (("sdpa_flash", "auto", causal), ("sdpa_cudnn", "auto", causal), ("custom", "auto", causal),
                    ("custom", "one", causal), ("custom", "auto+det", causal)):
            r = by_kernel[key]
            assert r["pass_"] == "bwd" and r["method"] == "cuda_graph", r  # one method for every backend
            assert float(r["tflops"]) > 1.0, r
        for section in ("auto", "one", "auto+det"):
            assert float(by_kernel[("custom", section, causal)]["rel_err_vs_flash"]) <= 2e-2
    # the backward alone is shorter than forward and backward together
    both = tmp_path / "both.csv"
    assert bench.main(["--dtypes", "bf16", "--shapes", "4x16x1024x128", "--pass", "fwd_bwd", "--min-time-ms", "20",
                       "--out", str(both)]) == 0
    ms_both = {(r["kernel"], r["causal"]): float(r["ms"]) for r in csv.DictReader(both.open()) if not r["variant"]}
    for (kernel, section, causal), r in by_kernel.items():
        if section == "auto":
            assert float(r["ms"]) < ms_both[(kernel, causal)], (kernel, causal)


@pytest.mark.nvcc  # the custom kernels are built
def test_the_profile_runner_calls_our_forward(capsys):
    """flashwatt.kernel_profile run: what Nsight Compute is pointed at (bf16, and fp8 on Hopper), to its end."""
    from flashwatt import kernel_profile

    precisions = ["bf16"] + (["fp8"] if torch.cuda.get_device_capability() == (9, 0) else [])
    for precision in precisions:
        assert kernel_profile.main(["run", "2x4x1024x128", "--precision", precision, "--calls", "3"]) == 0
        out = capsys.readouterr().out
        assert f"{precision} 2x4x1024x128 default causal=False: 3 calls of our forward" in out, out
    assert kernel_profile.main(["run", "2x4x1024x128", "--pass", "bwd", "--calls", "2", "--causal"]) == 0
    out = capsys.readouterr().out
    assert "bf16 2x4x1024x128 default causal=True: 2 calls of our backward (" in out, out
