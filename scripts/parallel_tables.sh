#!/usr/bin/env bash
# The multi-GPU tables on a machine with 2, 4 or 8 GPUs: one suite per call, so that each fits
# a ten-minute command, then docs/parallel.md from every table there is:
#   scripts/parallel_tables.sh distributed      # Llama-3-8B attention at 128k, the seed's one-head problem
#   scripts/parallel_tables.sh models           # Llama-3.2-1B (FSDP, context parallelism), Llama-3-8B FSDP
# Each runs that suite's slice for this machine's GPU count (config/overlays/parallel-g<N>.yaml)
# through the workflow with tests/gpu/run_on_device.sh (results, logs and the report's tables
# to $OUT), then writes docs/parallel.md (python -m flashwatt.distributed.parallel_tables) and
# copies it to $OUT. A run cut short by the time limit (FLASHWATT_RUN_LIMIT_S) goes on where
# it stopped when called again on the same machine.
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:?usage: scripts/parallel_tables.sh distributed|models}
case $suite in distributed|models) ;; *) echo "suite $suite: give distributed or models" >&2; exit 2 ;; esac
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
overlay=config/overlays/parallel-g$gpus.yaml
if [ ! -f "$overlay" ]; then
  echo "this machine shows $gpus GPU(s); there are slices for 2, 4 and 8 (config/overlays/parallel-g<N>.yaml)" >&2
  exit 2
fi
export OUT=${OUT:-$PWD/device-out}
bash tests/gpu/run_on_device.sh - --configfile config/config.yaml "$overlay" --config suite="$suite"
status=$?
export PYTHONPATH=$PWD/src:/tmp/site:${PYTHONPATH:-}
python3 -m flashwatt.distributed.parallel_tables --out docs/parallel.md && cp docs/parallel.md "$OUT/parallel.md" \
  || status=1
exit $status
