"""The control study on one GPU: the oracle, budgets 300-650 W, a budget schedule, a
co-located load, the energy mode, an NVML failure, a cold and a warm start, and the
controller's overhead, all in one process so every comparison is side by side. Every run
but the warm start's second starts cold (no warm-start cache), as the study always has.

    python -m flashwatt.control.bench --out DIR [--quick]

Writes DIR/control.json (every figure of merit, the device), DIR/oracle.csv, DIR/runs.csv
and DIR/traces.parquet (every run's trace, one row per decision tick).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from flashwatt.control.sensor import idle_power
from flashwatt.control.study import bare_loop_tokens_per_s, oracle, run_scenario
from flashwatt.control.suite import DEFAULT_ORACLE
from flashwatt.control.summary import best_static_under
from flashwatt.control.tenants import Tenant
from flashwatt.control.workloads import Scenario, Workload
from flashwatt.telemetry import open_telemetry

STATIC_CONFIGS = DEFAULT_ORACLE["configurations"]
DUTIES = [1.0, *DEFAULT_ORACLE["duties"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the study)")
    ap.add_argument("--budgets", default="300,350,400,450,500,550,600,650")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"flashwatt.control.bench: the study drives a CUDA GPU; none is visible (torch {torch.__version__}"
                         f"{', built without CUDA' if torch.version.cuda is None else ''}); run it on a GPU node")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", torch.cuda.current_device())
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    telemetry = open_telemetry([uuid])
    if not telemetry.available:
        raise SystemExit(f"control study needs NVML: {telemetry.reason}")
    scale = 0.4 if args.quick else 1.0
    steady = Workload("steady")
    stream = Workload("stream", dtype="bf16")
    # warm every backend once (our kernel's build, cuDNN's plans) before anything is timed
    run_scenario(Scenario("warm-up", steady, "static", configuration="custom", seconds=1.0), telemetry, device)
    for label in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
        run_scenario(Scenario("warm-up", steady, "static", configuration=label, seconds=0.3), telemetry, device)
    time.sleep(2.0)
    idle = idle_power(telemetry, seconds=1.0)
    report: dict = {"device": telemetry.identity()[0], "torch": torch.__version__, "idle_w": idle}
    t_start = time.monotonic()

    duties = {label: (DUTIES if label in DEFAULT_ORACLE["paced"] else [1.0]) for label in STATIC_CONFIGS}
    table = oracle(steady, telemetry, device, STATIC_CONFIGS, duties, 2.0 * scale, idle)
    table.to_csv(args.out / "oracle.csv", index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"), flush=True)

    runs, traces = [], []
    def record(merit, trace, **extra):
        merit.update(extra)
        runs.append(merit)
        traces.append(trace)
        keys = ["scenario", "tokens_per_s", "steady_tokens_per_s", "avg_power_w", "windows_within_pct",
                "worst_overshoot_pct", "settling_s", "j_per_token", "final_config", "check_passed"]
        print({k: merit.get(k) for k in keys + list(extra)}, flush=True)

    for budget in [float(b) for b in args.budgets.split(",")]:
        merit, trace = run_scenario(Scenario(f"budget {budget:.0f}", steady, "budget", budget_w=budget,
                                             seconds=10.0 * scale + 4), telemetry, device, idle, cache=None)
        best = best_static_under(table, budget)
        record(merit, trace, best_static=None if best is None else f"{best['config']} d{best['duty']:g}",
               best_static_tokens_per_s=None if best is None else best["tokens_per_s"],
               vs_best_static=None if best is None else merit["tokens_per_s"] / best["tokens_per_s"],
               steady_vs_best_static=None if best is None or not merit.get("steady_tokens_per_s")
               else merit["steady_tokens_per_s"] / best["tokens_per_s"])

    merit, trace = run_scenario(Scenario("steps 600-400-550", steady, "budget", schedule=((0, 600.0), (6.0, 400.0), (11.0, 550.0)),
                                         seconds=16.0), telemetry, device, idle, cache=None)
    record(merit, trace)
    merit, trace = run_scenario(Scenario("co-located load at 500", steady, "budget", budget_w=500.0, seconds=16.0,
                                         tenants=(Tenant("gemm", 0.3, 8.0, 7.0),)), telemetry, device, idle,
                                cache=None)
    record(merit, trace)
    merit, trace = run_scenario(Scenario("stream at 450", stream, "budget", budget_w=450.0, seconds=12.0 * scale + 4),
                                telemetry, device, idle, cache=None)
    record(merit, trace)
    merit, trace = run_scenario(Scenario("energy", steady, "energy", seconds=15.0 * scale + 3), telemetry, device, idle,
                                cache=None)
    default = table[(table["config"] == "sdpa_default") & (table["duty"] == 1.0)]
    best = table[~table["repeat"]].dropna(subset=["j_per_token"]).sort_values("j_per_token").iloc[0]
    record(merit, trace, static_default_j_per_token=float(default["j_per_token"].iloc[0]) if len(default) else None,
           best_static_j=f"{best['config']} d{best['duty']:g}", best_static_j_per_token=float(best["j_per_token"]),
           vs_best_static_j=merit.get("j_per_token") / float(best["j_per_token"]) if merit.get("j_per_token") else None)
    merit, trace = run_scenario(Scenario("nvml failure at 5 s", steady, "budget", budget_w=450.0, seconds=9.0,
                                         nvml_failures=((5.0, float("inf")),)), telemetry, device, idle, cache=None)
    record(merit, trace, fallback_ticks=int((trace["phase"] == "fallback").sum()))
    with tempfile.TemporaryDirectory() as cache:  # the same run twice: cold, then from what the first learned
        for start in ("cold", "warm"):
            merit, trace = run_scenario(Scenario(f"{start} start at 400", steady, "budget", budget_w=400.0,
                                                 seconds=6.0), telemetry, device, idle, cache=cache)
            first = trace[trace["t"] <= 1.0]
            record(merit, trace, first_second_tokens_per_s=float(first["tokens"].sum() / max(first["t"].max(), 1e-9)),
                   warm_shapes=merit["warm_start"]["warm_shapes"])

    fastest = table.dropna(subset=["tokens_per_s"]).sort_values("tokens_per_s").iloc[-1]["config"]
    bare = bare_loop_tokens_per_s(steady, fastest, device, 3.0)
    merit, trace = run_scenario(Scenario(f"static {fastest} (overhead)", steady, "static", configuration=fastest,
                                         seconds=3.0), telemetry, device, idle)
    record(merit, trace, bare_tokens_per_s=bare, overhead_pct=(1 - merit["tokens_per_s"] / bare) * 100)

    report["study_s"] = time.monotonic() - t_start
    report["runs"] = runs
    (args.out / "control.json").write_text(json.dumps(report, indent=1, default=str))
    pd.DataFrame(runs).to_csv(args.out / "runs.csv", index=False)
    pd.concat(traces, ignore_index=True).to_parquet(args.out / "traces.parquet", index=False)
    telemetry.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
