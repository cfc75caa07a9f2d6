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
                            "--out", str(out)])
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
        if r["kernel"] == "custom":
            assert float(r["rel_err_vs_flash"]) <= 1e-2, r
        else:
            assert math.isnan(float(r["rel_err_vs_flash"])), r
