"""How many steps each phase of a model cell's job runs, and how long a controller cell may
settle, unless the suite's `steps` says otherwise; torch-free, for the suite's planning and
both jobs (one GPU: flashwatt.models.job; several: flashwatt.models.parallel_job)."""
from __future__ import annotations

DEFAULT_STEPS = {"warmup_steps": 3, "timed_steps": 10, "attention_steps": 3}
# Profiled steps of a multi-GPU cell that split out its communication.
PARALLEL_STEPS = {"comm_steps": 2}
# A controller cell's longest settling (its candidates tried for every shape the model calls).
DEFAULT_SETTLE_S = 30.0
# A governed cell (flashwatt.control.governor_setting): how long its steps run under the
# controller, the knobs it may turn (flashwatt.control.configuration.KNOBS; backends default
# to the front's), and the static front it is judged against: every backend x micro-batch
# split x duty, each run for `seconds`.
GOVERNOR_DEFAULTS = {
    "seconds": 30.0,
    "knobs": {},
    "front": {"backends": ["sdpa_default", "sdpa_cudnn", "custom"], "micro_batches": [1, 2],
              "duties": [1.0, 0.8, 0.6, 0.45, 0.3], "seconds": 3.0},
    "on_peer_loss": "end",
}
