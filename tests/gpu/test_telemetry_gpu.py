"""Real NVML on a real GPU: the energy counter, the counter-vs-integral check, the
sampler's cost, and reproducibility of energy per call. Needs torch with CUDA."""
from __future__ import annotations

import json
import math
import statistics
import time

import pytest
import torch

from flashwatt.energy import measure_energy
from flashwatt.telemetry import Sampler, decode_clock_reasons, open_telemetry

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tel():
    uuid = str(torch.cuda.get_device_properties(0).uuid)  # torch: no "GPU-" prefix
    t = open_telemetry([uuid])
    assert t.available, t.reason
    yield t
    t.close()


def _sync() -> None:
    torch.cuda.synchronize()


def _matmul(n: int = 8192, dtype=torch.bfloat16):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)

    def call() -> None:
        torch.matmul(a, b, out=c)

    return call


def _run_for(call, seconds: float) -> int:
    _sync()
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            call()
        n += 8
    _sync()
    return n


def _summary(w) -> dict:
    keys = ("window_s", "calls", "time_per_call_s", "energy_j", "avg_power_w", "peak_power_w",
            "idle_power_w", "energy_per_call_j", "dynamic_energy_per_call_j", "counter_vs_integral_pct",
            "temp_start_c", "temp_end_c", "edges_aligned")
    out = {k: getattr(w, k) for k in keys}
    out["flags"] = list(w.flags)
    out["clock_reasons_s"] = w.clock_reasons_s
    out["violation_s"] = {k: v for k, v in w.violation_s.items() if v}
    return out


def test_identity_and_one_sample(tel):
    (ident,) = tel.identity()
    (sample,) = tel.sample()
    print("\nIDENTITY " + json.dumps(ident, default=str))
    print("SAMPLE " + json.dumps(sample, default=str))
    print("REASONS " + json.dumps(decode_clock_reasons(sample["clock_reasons"])))
    assert ident["uuid"].lower().endswith(str(torch.cuda.get_device_properties(0).uuid).lower())
    assert ident["energy_counter_supported"], ident["unsupported"]
    assert sample["energy_mj"] is not None and sample["energy_mj"] > 0
    assert sample["power_instant_w"] is not None and 10 < sample["power_instant_w"] < 2000
    assert sample["gpu_temp_c"] is not None


def test_energy_counter_advances_under_load(tel):
    call = _matmul()
    _run_for(call, 0.3)  # warm-up (cuBLAS heuristics, clocks)
    (e0,) = tel.energy_mj()
    t0 = time.monotonic()
    _run_for(call, 1.5)
    time.sleep(0.15)  # let the ~100 ms counter publish the last of the load
    (e1,) = tel.energy_mj()
    t1 = time.monotonic()
    watts = (e1 - e0) / 1000 / (t1 - t0)
    print(f"\ncounter advanced {e1 - e0} mJ in {t1 - t0:.2f} s: {watts:.0f} W")
    assert e1 > e0
    assert watts > 100.0  # a busy datacenter GPU draws far more than this


def test_counter_vs_integral_on_steady_matmul(tel):
    call = _matmul()
    _run_for(call, 0.5)
    w = measure_energy(call, _sync, tel, min_window_s=5.0, idle_settle_s=0.5, idle_window_s=1.0,
                       sampler_period_s=0.1)
    print("\nSTEADY_MATMUL " + json.dumps(_summary(w), default=str))
    assert w.available and w.energy_j and w.energy_j > 0
    assert w.per_gpu[0]["samples_in_window"] >= 40
    assert w.counter_vs_integral_pct is not None
    assert abs(w.counter_vs_integral_pct) < 5.0, w.counter_vs_integral_pct
    assert "counter_vs_integral>5%" not in w.flags
    assert "counter_invalid" not in w.flags
    assert w.avg_power_w > w.idle_power_w


def test_sampler_costs_under_one_percent(tel):
    call = _matmul()
    _run_for(call, 1.0)  # reach the steady (power-capped) state first
    batch, batches, rounds = 10, 40, 6

    def block() -> list[float]:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(batches)]
        for s, e in evs:
            s.record()
            for _ in range(batch):
                call()
            e.record()
        _sync()
        return [s.elapsed_time(e) / batch for s, e in evs]

    with_s, without_s, ratios, n_samples = [], [], [], 0
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)  # alternate: drift cancels
        got = {}
        for sampled in order:
            if sampled:
                smp = Sampler(tel, period_s=0.1).start()
                got[True] = block()
                smp.stop()
                n_samples += len(smp.rows)
            else:
                got[False] = block()
        with_s += got[True]
        without_s += got[False]
        ratios.append(statistics.median(got[True]) / statistics.median(got[False]))
    med_with, med_without = statistics.median(with_s), statistics.median(without_s)
    overhead = statistics.median(ratios) - 1.0
    print(f"\nSAMPLER_COST median kernel time without {med_without:.4f} ms, with {med_with:.4f} ms, "
          f"paired per-round overhead {100 * overhead:+.3f} % (rounds {[round(x, 4) for x in ratios]}), "
          f"{n_samples} samples taken")
    assert n_samples >= rounds * 4  # the sampler really ran during the sampled blocks
    assert overhead < 0.01
    assert med_with / med_without - 1.0 < 0.01


def _attention_calls():
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, L, D = 16, 8, 1024, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    scale = 1.0 / math.sqrt(D)

    def flash() -> None:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v)

    def naive() -> None:
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        torch.matmul(torch.softmax(s, dim=-1), v)

    return {"sdpa_flash": flash, "naive": naive}


def test_energy_per_call_reproducible_flash_vs_naive(tel):
    kernels = _attention_calls()
    for call in kernels.values():
        _run_for(call, 1.0)  # warm-up and bring the card to its loaded temperature
    results: dict[str, list] = {name: [] for name in kernels}
    for _run in range(3):
        for name, call in kernels.items():  # interleaved, so slow drift hits both alike
            w = measure_energy(call, _sync, tel, min_window_s=3.0, idle_settle_s=0.5, idle_window_s=1.0)
            assert w.available and w.energy_per_call_j is not None, w.flags
            results[name].append(w)
    print("\nkernel      run  mJ/call  dyn mJ/call  ms/call   avg W  peak W  idle W  cnt-vs-int %  flags")
    for name, ws in results.items():
        for i, w in enumerate(ws):
            print(f"{name:<11} {i:>3}  {1e3 * w.energy_per_call_j:7.2f}  {1e3 * w.dynamic_energy_per_call_j:11.2f}"
                  f"  {1e3 * w.time_per_call_s:7.4f}  {w.avg_power_w:6.1f}  {w.peak_power_w:6.1f}"
                  f"  {w.idle_power_w:6.1f}  {w.counter_vs_integral_pct:+11.2f}  {','.join(w.flags)}")
    for name, ws in results.items():
        e = [w.energy_per_call_j for w in ws]
        spread = (max(e) - min(e)) / statistics.median(e)
        print(f"{name}: energy per call spread over 3 runs {100 * spread:.2f} %")
        assert spread < 0.03, (name, e)
    med = {name: statistics.median(w.energy_per_call_j for w in ws) for name, ws in results.items()}
    assert med["sdpa_flash"] < med["naive"]
