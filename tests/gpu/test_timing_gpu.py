"""The one timing method on a real GPU: short kernels are timed as the energy window sees
them, reruns agree, and every backend of the seed suite can be captured in a CUDA graph."""
import statistics

import pytest
import torch

from flashwatt import measure
from flashwatt.attention.cell import Cell
from flashwatt.config import load_config
from flashwatt.settings import measure_settings
from flashwatt.kernels import get_kernel
from flashwatt.attention.job import run_cell
from flashwatt.timing import Workload

pytestmark = pytest.mark.gpu

# Short windows: these tests compare figures with each other, they are not results.
SETTINGS = {**measure_settings(load_config(), "seed"), "energy_window_s": 1.5, "idle_settle_s": 0.3,
            "idle_window_s": 0.5}
SHORT = dict(suite="seed", precision="bf16", seq_len=512, batch=16, heads=8, head_dim=64)  # ~30-40 µs a call


@pytest.mark.parametrize("kernel", [pytest.param("custom", marks=pytest.mark.nvcc), "sdpa_cudnn", "sdpa_flash"])
def test_short_kernel_reruns_agree_and_match_the_energy_window(kernel):
    records = [run_cell(Cell(kernel=kernel, **SHORT), SETTINGS).record for _ in range(3)]
    for rec in records:
        assert rec["status"] == "ok", rec.get("reason")
        timing = rec["timing"]
        assert timing["method"] == "cuda_graph", timing.get("fallback_reason")
        # The window drives the same graph replays: both figures are the same work.
        assert abs(timing["timed_vs_window_pct"]) <= 5, timing
    medians = [rec["timing"]["median_ms"] for rec in records]
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    print(kernel, [f"{m * 1e3:.2f} us" for m in medians], f"spread {spread:.2%}",
          [f"{r['timing']['timed_vs_window_pct']:+.2f}%" for r in records],
          [f"eager {r['timing']['eager_ms'] * 1e3:.1f} us" for r in records])
    assert spread <= 0.02, medians


SEED_KERNELS = ["naive", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "custom"]


# Every kernel that declares a backward is captured for fwd_bwd too (custom's includes its
# own backward kernels).
@pytest.mark.parametrize("kernel,pass_", [pytest.param(k, p, marks=[pytest.mark.nvcc] if k == "custom" else [])
                                          for k in SEED_KERNELS for p in ("fwd", "fwd_bwd")
                                          if get_kernel(k).differentiable or p == "fwd"])
def test_every_seed_backend_is_captured_in_a_graph(kernel, pass_):
    dev = torch.device("cuda")
    cell = Cell(suite="seed", kernel=kernel, precision="bf16", seq_len=256, batch=2, heads=2, head_dim=64, pass_=pass_)
    impl = get_kernel(kernel)
    inputs = measure.make_inputs(cell, dev, 0, 2)
    dout = torch.randn(inputs[0][0].shape, device=dev).to(inputs[0][0].dtype) if pass_ == "fwd_bwd" else None
    call = measure.make_call(impl, cell, inputs, dout)
    with torch.enable_grad() if pass_ == "fwd_bwd" else torch.no_grad():
        work = Workload.build(call, dev, per_call_s=1e-4)
        assert work.method == "cuda_graph", work.fallback_reason
        work.step()
        torch.cuda.synchronize()
