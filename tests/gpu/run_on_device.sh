#!/usr/bin/env bash
# On a GPU machine, from a copy of the repository: the GPU tests, then suites through
# the real workflow (local executor, real NVML), everything worth keeping copied to $OUT.
#   tests/gpu/run_on_device.sh [pytest-targets|-] [snakemake --config items ...]
# FLASHWATT_BENCH=1 adds the kernel benchmark (custom vs sdpa_flash vs sdpa_cudnn, CSV in
# $OUT; FLASHWATT_BENCH_ARGS passes options, e.g. "--variants") after the tests.
# FLASHWATT_REPEAT=<record path> reruns that one cell three times and prints its timing and energy.
# Python packages the machine lacks come as wheels in .whl/ (see README: GPU runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 FLASHWATT_BUILD_CACHE=${FLASHWATT_BUILD_CACHE:-/tmp/flashwatt-build}
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, snakemake, submitit; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/device.txt"

tests=${1:--}; shift || true
status=0
if [ "$tests" != "-" ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider $tests 2>&1 | tee "$OUT/gpu-tests.log" || status=1
fi
if [ -n "${FLASHWATT_BENCH:-}" ]; then
  python3 -m flashwatt.bench --out "$OUT/bench.csv" ${FLASHWATT_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
fi
if [ "$#" -gt 0 ]; then
  timeout -s INT -k 30 "${FLASHWATT_RUN_LIMIT_S:-540}" python3 -m flashwatt.cli run --cores 4 "$@" \
    > "$OUT/snakemake.log" 2>&1 || status=1
  tail -5 "$OUT/snakemake.log"
  suite=$(sed -n 's/^flashwatt: suite \([a-z0-9_]*\),.*/\1/p' "$OUT/snakemake.log")
  suite=${suite:-unknown}
  tar czf "$OUT/results-$suite.tgz" results/"$suite" results/cells/"$suite" figures/"$suite" results/logs 2>/dev/null
  python3 - "$suite" <<'PY'
import sys
from pathlib import Path

import pandas as pd

pd.set_option("display.width", 250); pd.set_option("display.max_rows", 500); pd.set_option("display.max_columns", 50)
fmt = lambda x: f"{x:.4g}"
summary, control = Path(f"results/{sys.argv[1]}/summary.parquet"), Path(f"results/{sys.argv[1]}/control.parquet")
if summary.exists():
    f = pd.read_parquet(summary)
    cols = ["kernel", "precision", "seq_len", "batch", "heads", "head_dim", "causal", "status", "median_ms",
            "tflops", "rel_err", "energy_per_call_j", "avg_power_w", "peak_power_w", "gflops_per_w",
            "counter_vs_integral_pct", "clock_reasons"]
    print(f[cols].to_string(index=False, float_format=fmt))
models = Path(f"results/{sys.argv[1]}/models.parquet")
if models.exists():
    m = pd.read_parquet(models)
    m["GiB"] = m["peak_allocated_bytes"] / 2**30
    cols = ["model", "backend", "phase", "seq_len", "batch", "recompute", "compiled", "status", "step_ms", "forward_ms",
            "backward_ms", "optimizer_ms", "tokens_per_s", "mfu", "attention_share", "GiB", "j_per_token",
            "avg_power_w", "check_passed", "logits_error", "grad_error", "speedup_vs_sdpa_default",
            "energy_vs_sdpa_default", "compile_s", "oom_stage", "device"]
    print(m[cols].to_string(index=False, float_format=fmt))
    if "governor" in m and m["governor"].notna().any():  # governed cells against their front
        cols = ["model", "phase", "gpus", "governor", "control_budget_w", "tokens_per_s", "avg_power_w",
                "control_windows", "control_windows_within_pct", "vs_front", "steady_vs_front",
                "vs_static_default_j", "control_fault"]
        print(m[m["governor"].notna()].reindex(columns=cols).to_string(index=False, float_format=fmt))
training = Path(f"results/{sys.argv[1]}/training.parquet")
if training.exists():
    t = pd.read_parquet(training)
    t["GiB"] = t["peak_allocated_bytes"] / 2**30
    cols = ["model", "backend", "optimizer", "schedule", "lr", "seed", "status", "initial_val_loss",
            "initial_loss_agrees", "final_val_loss", "tokens_per_s", "steady_tokens_per_s", "wall_s", "eval_share",
            "energy_j", "mean_power_w", "GiB", "target_reached", "tokens_to_target", "wall_s_to_target",
            "energy_j_to_target", "duration_s", "device"]
    print(t[cols].to_string(index=False, float_format=fmt))
    s = pd.read_csv(f"results/{sys.argv[1]}/training_settings.csv")
    cols = [c for c in s.columns if c.startswith(("wall_s_to_target", "energy_j_to_target", "final_val_loss",
                                                  "steady_tokens"))]
    print(s[["setting", "runs", "ok", "reached", *cols]].to_string(index=False, float_format=fmt))
if control.exists():
    runs = pd.read_parquet(control)
    oracle = pd.read_parquet(f"results/{sys.argv[1]}/control_oracle.parquet")
    print(oracle[["group", "config", "duty", "tokens_per_s", "avg_power_w", "j_per_token", "check_passed"]]
          .to_string(index=False, float_format=fmt))
    cols = ["group", "scenario", "status", "reason", "tokens_per_s", "avg_power_w", "windows_within_pct",
            "worst_overshoot_pct", "settling_s", "explore_s", "steady_tokens_per_s", "steady_avg_power_w",
            "best_static", "vs_best_static", "steady_vs_best_static", "j_per_token", "steady_j_per_token",
            "best_static_j", "vs_best_static_j", "vs_static_default_j", "final_config", "check_passed",
            "oracle_same_device", "windows_within_pct_at_reads", "meter_gap_ms", "meter_unplaced", "device"]
    print(runs.reindex(columns=cols).to_string(index=False, float_format=fmt))
    pooled = Path(f"results/{sys.argv[1]}/control_pooled.parquet")
    if pooled.exists():  # the scheduler's targets, pooled
        cols = ["group", "runs_set", "runs", "windows_within_pct", "windows_within_pct_at_reads", "min_windows_within_pct", "windows_over_10pct",
                "step_settle_p50_s", "step_settle_p95_s", "vs_front", "min_vs_front", "budget_drawn",
                "vs_front_at_drawn", "first_windows_within_pct", "first_second_vs_front", "energy_gap_pct", "unmet"]
        print(pd.read_parquet(pooled).reindex(columns=cols).to_string(index=False, float_format=fmt))
PY
fi
if [ -n "${FLASHWATT_REPEAT:-}" ]; then
  for i in 1 2 3; do
    python3 -m snakemake --cores 1 -q -f "$FLASHWATT_REPEAT" >> "$OUT/repeat.log" 2>&1 || status=1
    cp "$FLASHWATT_REPEAT" "$OUT/repeat-$i.json"
  done
  python3 - "$OUT" <<'PY'
import json, sys
for i in (1, 2, 3):
    r = json.load(open(f"{sys.argv[1]}/repeat-{i}.json")); e = r["energy"]
    print(f"repeat {i}: {r['timing']['median_ms']:.4f} ms, {e['energy_per_call_j']*1e3:.2f} mJ/call, "
          f"{e['avg_power_w']:.0f} W avg, {e['peak_power_w']:.0f} W peak, window {e['window_s']:.2f} s")
PY
fi
exit $status
