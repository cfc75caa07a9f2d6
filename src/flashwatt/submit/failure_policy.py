"""How long a cell of several processes may wait on a rank that died, hung or never joined.

    ranks:
      failure_timeout_s: 60   # a failed rank ends its cell within this bound
      stop_grace_s: 5         # SIGTERM to each rank's process group, SIGKILL after this
      solo_phase_timeout_s: 600  # how long the other ranks wait on rank 0's work alone

The config's `ranks` block reaches the job through environment variables the submitting
side sets (FLASHWATT_RANK_FAILURE_TIMEOUT_S, FLASHWATT_RANK_STOP_GRACE_S,
FLASHWATT_RANK_SOLO_PHASE_TIMEOUT_S), not
through the cell's spec: how long to wait on a failure is not what a cell measures, so
changing it must not rerun measured cells.

From the bound, what PyTorch is told (the rank side, flashwatt.distributed.rendezvous):

- the time a failure may take to be seen is `detect_s` = failure_timeout_s - stop_grace_s
  - MONITOR_SLACK_S, shared by two PyTorch timeouts that can follow one another:
- every process group's timeout (`init_process_group(timeout=...)`, the rendezvous
  included) is detect_s over gloo, where a collective waiting that long raises, and
  `collective_timeout_s` = detect_s less twice the heartbeat timeout over NCCL, where the
  watchdog aborts it: a peer hung, never joined, or died where the transport cannot tell;
- NCCL's asynchronous error handling stays on (TORCH_NCCL_ASYNC_ERROR_HANDLING=3: on a
  timeout or an NCCL error the watchdog aborts the communicators and ends the process),
  and its heartbeat monitor kills a process whose watchdog itself is stuck
  (TORCH_NCCL_ENABLE_MONITORING=1, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC = detect_s / 4, at most
  5 s: a healthy watchdog beats far more often, and the collectives keep the rest). The
  abort of a communicator whose peer hangs inside a kernel can itself hang: on two H100s a
  hung rank's peer timed out after the collective timeout, then sat in the abort until the
  monitor, which checks the heartbeat once per its timeout, killed it (up to two of them
  later); so the collective timeout plus twice the heartbeat's stays within detect_s.
  TORCH_NCCL_BLOCKING_WAIT is left off: it would make the host wait for every collective
  and change what is timed.

A phase that rank 0 runs alone (a float64 reference, the problem on one GPU, a model's
one-process check) may last longer than any collective should wait: the other ranks wait
for it on a gloo group of their own whose timeout is `solo_phase_timeout_s`
(flashwatt.distributed.rank_zero), so that a rank 0 that hangs there ends the cell after
that long, and one that dies there at once.

and on the parent's side (flashwatt.distributed.rank_supervisor): the first rank that
ends badly (a signal, an exception, an exit status) makes it stop every other rank,
SIGTERM to each rank's process group and SIGKILL after `stop_grace_s`.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

DEFAULT_FAILURE_TIMEOUT_S = 60.0
DEFAULT_STOP_GRACE_S = 5.0
DEFAULT_SOLO_PHASE_TIMEOUT_S = 600.0
# Between a collective's timeout and the bound: the waiting ranks' exit (the supervisor gives
# them SETTLE_S to time out on their own), the supervisor noticing, and the job's own end (its
# task and the waiting side), on a loaded host.
MONITOR_SLACK_S = 8.0
MIN_COLLECTIVE_TIMEOUT_S = 1.0
# NCCL's heartbeat monitor's timeout, at most (module docstring).
HEARTBEAT_MAX_S = 5
ENV_FAILURE_TIMEOUT = "FLASHWATT_RANK_FAILURE_TIMEOUT_S"
ENV_STOP_GRACE = "FLASHWATT_RANK_STOP_GRACE_S"
ENV_SOLO_PHASE_TIMEOUT = "FLASHWATT_RANK_SOLO_PHASE_TIMEOUT_S"
CONFIG_KEY = "ranks"


@dataclass(frozen=True)
class FailurePolicy:
    failure_timeout_s: float = DEFAULT_FAILURE_TIMEOUT_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    solo_phase_timeout_s: float = DEFAULT_SOLO_PHASE_TIMEOUT_S

    def __post_init__(self) -> None:
        for key in ("stop_grace_s", "solo_phase_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"config key {CONFIG_KEY}.{key}={getattr(self, key)}: must be positive")
        least = self.stop_grace_s + MONITOR_SLACK_S + 4 * MIN_COLLECTIVE_TIMEOUT_S
        if self.failure_timeout_s < least:
            raise ValueError(f"config key {CONFIG_KEY}.failure_timeout_s={self.failure_timeout_s}: must be at least "
                             f"{least:g} (stop_grace_s {self.stop_grace_s:g} + {MONITOR_SLACK_S:g} s to notice a "
                             f"failure + {4 * MIN_COLLECTIVE_TIMEOUT_S:g} s for a collective's timeout and NCCL's "
                             "heartbeat monitor)")

    @property
    def detect_s(self) -> float:
        """How long a failure may take to be seen by the ranks (module docstring)."""
        return self.failure_timeout_s - self.stop_grace_s - MONITOR_SLACK_S

    @property
    def collective_timeout_s(self) -> float:
        return self.detect_s - 2 * self.heartbeat_timeout_s

    @property
    def heartbeat_timeout_s(self) -> int:
        # Short: a healthy watchdog beats far more often; long collectives keep the rest.
        return max(1, min(HEARTBEAT_MAX_S, int(self.detect_s / 4)))

    @property
    def collective_timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.collective_timeout_s)

    def timeout_for(self, backend: str) -> datetime.timedelta:
        """A process group's timeout on this backend: gloo raises where it waits, so a
        collective (or the rendezvous) may take the whole time to see a failure; NCCL's
        abort after a timeout can hang, so it takes half (module docstring)."""
        return self.collective_timeout if backend == "nccl" else datetime.timedelta(seconds=self.detect_s)

    @classmethod
    def from_config(cls, config: dict) -> "FailurePolicy":
        block = config.get(CONFIG_KEY) or {}
        return cls(float(block.get("failure_timeout_s", DEFAULT_FAILURE_TIMEOUT_S)),
                   float(block.get("stop_grace_s", DEFAULT_STOP_GRACE_S)),
                   float(block.get("solo_phase_timeout_s", DEFAULT_SOLO_PHASE_TIMEOUT_S)))

    @classmethod
    def from_environment(cls) -> "FailurePolicy":
        def number(name: str, default: float) -> float:
            text = os.environ.get(name)
            try:
                return float(text) if text else default
            except ValueError:
                raise ValueError(f"{name}={text!r}: give seconds (config key {CONFIG_KEY})") from None

        return cls(number(ENV_FAILURE_TIMEOUT, DEFAULT_FAILURE_TIMEOUT_S), number(ENV_STOP_GRACE, DEFAULT_STOP_GRACE_S),
                   number(ENV_SOLO_PHASE_TIMEOUT, DEFAULT_SOLO_PHASE_TIMEOUT_S))

    def submission_environment(self) -> dict[str, str]:
        """What the submitting side exports so that the job reads this policy back."""
        return {ENV_FAILURE_TIMEOUT: f"{self.failure_timeout_s:g}", ENV_STOP_GRACE: f"{self.stop_grace_s:g}",
                ENV_SOLO_PHASE_TIMEOUT: f"{self.solo_phase_timeout_s:g}"}

    def rank_environment(self) -> dict[str, str]:
        """PyTorch's NCCL settings every rank starts with (module docstring); a value the
        user set already is kept, except that error handling is never switched off."""
        wanted = {"TORCH_NCCL_ENABLE_MONITORING": "1",
                  "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(self.heartbeat_timeout_s)}
        env = {k: os.environ.get(k) or v for k, v in wanted.items()}
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3" if os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") in (
            None, "", "0") else os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
        return {**self.submission_environment(), **env}

    def as_dict(self) -> dict[str, float]:
        return {"failure_timeout_s": self.failure_timeout_s, "stop_grace_s": self.stop_grace_s,
                "collective_timeout_s": self.collective_timeout_s, "solo_phase_timeout_s": self.solo_phase_timeout_s}
