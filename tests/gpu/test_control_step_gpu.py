"""The step-level controller on a real GPU with real NVML, against the static front of the same
step measured in the same process on the same GPU (the issue's targets):

- Llama-3.2-1B training at L4096 (B2, bf16) and Llama-3-8B prefill at L8192 (B1, bf16): the
  static front of (backend x pacing x micro-batch), then budgets from 300 to 650 W and the
  energy mode, each a governed run of the same step; every run's 1 s windows within budget
  + 3% in at least 95% of them, throughput after exploration at least 0.95 of the front at
  the budget (the line between its static points: pacing time-shares two of them; below the
  lowest, the line to idle, so a budget under every point measured is judged too), the energy mode within 3% of the least-energy static
  point (and its joules per token against the PyTorch default's printed);
- a board made hot first (full-duty steps), then held under a temperature limit a few
  degrees below where it got: the share of 1 s windows at or below the limit + 1 degC from
  the first one there, and how long the cooling took.

Every table is printed before the targets are asserted, so a run that misses one still
reports what it measured. Lengths: FLASHWATT_STEP_SECONDS (each governed run, default 25),
FLASHWATT_FRONT_SECONDS (each static point, default 5: at 3 s a point at duty 0.3-0.55 held 4-7
steps of a training step, and two fronts of the same step read 5-8% apart there).

    tests/gpu/run_on_device.sh "tests/gpu/test_control_step_gpu.py -k llama_1b -s"   # ~5.5 min on an H100
    tests/gpu/run_on_device.sh "tests/gpu/test_control_step_gpu.py -k llama_8b -s"   # ~5 min
    tests/gpu/run_on_device.sh "tests/gpu/test_control_step_gpu.py -k hot -s"        # ~2 min
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from flashwatt.control import Controller
from flashwatt.control.sensor import idle_power
from flashwatt.control.step_study import front_rows, governed_run, judge
from flashwatt.models.attention import use_backend
from flashwatt.models.cell import ModelCell
from flashwatt.models.presets import model_spec
from flashwatt.models.step import build_model, make_step
from flashwatt.telemetry import open_telemetry

pytestmark = pytest.mark.gpu
SECONDS = float(os.environ.get("FLASHWATT_STEP_SECONDS", 25))
FRONT_SECONDS = float(os.environ.get("FLASHWATT_FRONT_SECONDS", 5))
BUDGETS = (300.0, 450.0, 650.0)
pd.set_option("display.width", 250)
pd.set_option("display.max_columns", 40)


def keep_trace(trace: pd.DataFrame, name: str) -> None:
    """Each governed run's trace, tick by tick, to $OUT/control-traces where the device run
    collects its files (tests/gpu/run_on_device.sh): what a missed target is read from."""
    out = os.environ.get("OUT")
    if out and len(trace):
        folder = Path(out) / "control-traces"
        folder.mkdir(parents=True, exist_ok=True)
        trace.to_parquet(folder / f"{name}.parquet")


class Bench:
    """One model's step on this GPU: built, warmed with every backend, the idle power read."""

    def __init__(self, name: str, phase: str, seq_len: int, batch: int, backends: list[str]):
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.telemetry = open_telemetry([str(torch.cuda.get_device_properties(self.device).uuid)])
        assert self.telemetry.available, self.telemetry.reason
        self.model = build_model(model_spec(name), "bf16", self.device, seed=0)
        self.cell = ModelCell("gpu", name, backends[0], "bf16", phase, seq_len, batch)
        self.step = make_step(self.model, self.cell, self.device, seed=0)
        self.backends = backends
        for backend in backends:
            use_backend(self.model, backend, "bf16", phase == "train")
            for _ in range(2):
                self.step.run()
        torch.cuda.synchronize(self.device)
        time.sleep(2.0)
        self.idle_w = idle_power(self.telemetry, seconds=1.0)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def controller(self, mode: str, budget_w=None, **options) -> Controller:
        ctl = Controller(mode, budget_w, self.device, telemetry=self.telemetry, idle_w=self.idle_w, **options)
        ctl.attach(self.model, precision="bf16", train=self.cell.phase == "train")
        return ctl

    def front(self, micro_batches: list[int], duties: list[float]) -> list[dict]:
        labels = [b + (f" x{m}" if m > 1 else "") for b in self.backends for m in micro_batches]

        def run_static(label: str, duty: float):
            with self.controller("static", configuration=label, duty=duty, cache=None) as ctl:
                return governed_run(ctl, self.step.run, self.cell.tokens, FRONT_SECONDS, sync=self.sync)

        rows, _ = front_rows(run_static, labels, duties)
        print(f"\n{self.cell.model} {self.cell.phase} L{self.cell.seq_len} B{self.cell.batch}: static front "
              f"(idle {self.idle_w:.0f} W, {torch.cuda.get_device_name(self.device)})")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        return rows

    def governed(self, front: list[dict], mode: str, budget_w, knobs: dict, cache) -> dict:
        with self.controller(mode, budget_w, knobs=knobs, cache=cache) as ctl:
            merit, trace = governed_run(ctl, self.step.run, self.cell.tokens, SECONDS, sync=self.sync)
        keep_trace(trace, f"{self.cell.model}-{self.cell.phase}-{mode}" + (f"-{budget_w:g}w" if budget_w else ""))
        return {"mode": mode, "budget_w": budget_w, **{k: merit.get(k) for k in (
            "windows", "windows_within_pct", "worst_overshoot_pct", "explore_s", "tokens_per_s", "steady_tokens_per_s",
            "avg_power_w", "steady_avg_power_w", "j_per_token", "steady_j_per_token", "slept_s", "final_config")},
                "calls": merit["calls"], **judge(merit, front, mode, budget_w, self.idle_w)}


def study(bench: Bench, micro_batches: list[int], duties: list[float], tmp_path) -> pd.DataFrame:
    front = bench.front(micro_batches, duties)
    knobs = {"backend": bench.backends, "micro_batches": micro_batches}
    runs = [bench.governed(front, "budget", budget, knobs, tmp_path) for budget in BUDGETS]
    runs.append(bench.governed(front, "energy", None, knobs, tmp_path))
    table = pd.DataFrame(runs)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return table


def assert_targets(table: pd.DataFrame) -> None:
    budget = table[table["mode"] == "budget"]
    assert (budget["windows_within_pct"] >= 95.0).all(), budget
    assert (budget["steady_vs_front"] >= 0.95).all(), budget
    energy = table[table["mode"] == "energy"].iloc[0]
    # At or below the least-energy static point (within 3%): where PyTorch's default is that
    # point the energy mode cannot beat it, and the printed vs_static_default_j says by how much.
    steady_j = energy["steady_j_per_token"] or energy["j_per_token"]
    assert steady_j <= 1.03 * energy["best_static_j_per_token"], energy


def test_llama_1b_training_at_4k_holds_budgets_at_the_static_front(tmp_path):
    bench = Bench("llama_3_2_1b", "train", 4096, 2, ["sdpa_default", "custom"])
    assert_targets(study(bench, [1, 2], [1.0, 0.75, 0.55, 0.4, 0.3], tmp_path))


def test_llama_8b_prefill_at_8k_holds_budgets_at_the_static_front(tmp_path):
    bench = Bench("llama_3_8b", "prefill", 8192, 1, ["sdpa_default", "sdpa_cudnn", "custom"])
    assert_targets(study(bench, [1], [1.0, 0.75, 0.55, 0.4, 0.3], tmp_path))


def test_a_hot_board_is_cooled_and_held_under_its_temperature_limit(tmp_path):
    from flashwatt.control.thermal_merit import temperature_merit

    bench = Bench("llama_3_2_1b", "train", 4096, 2, ["sdpa_default"])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 40.0:  # full-duty steps: the board heats toward its steady temperature
        bench.step.run()
    bench.sync()
    hot = bench.telemetry.sample()[0]["gpu_temp_c"]
    limit = hot - 4
    with bench.controller("budget", 650.0, temp_limit_c=limit, cache=None,
                          knobs={"backend": ["sdpa_default"]}) as ctl:
        merit, trace = governed_run(ctl, bench.step.run, bench.cell.tokens, 60.0, sync=bench.sync)
    thermal = temperature_merit(trace)
    print(f"\nhot start: {hot} degC after 40 s at full duty, limit {limit} degC:", thermal,
          {k: merit.get(k) for k in ("windows_within_pct", "avg_power_w", "steady_avg_power_w", "tokens_per_s")})
    print(trace[["t", "power_w", "temp_c", "thermal_cap_w", "duty"]].iloc[::10].to_string(index=False))
    assert thermal["temp_start_c"] >= limit + 2  # it did start hot
    assert thermal["temp_cooled_s"] is not None and thermal["temp_cooled_s"] <= 30.0
    assert thermal["temp_windows_within_pct"] >= 95.0, thermal
    assert merit["windows_within_pct"] >= 95.0
