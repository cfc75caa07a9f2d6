"""One power budget for every GPU of a job: the ranks share their readings each control
period over the job's own process group and pace together.

Each rank's controller reads its own GPU about ten times a second. In `exchange`, every
rank puts its reading (power, energy counter, temperature, which of them NVML gave, and
whether it is closing) in its own slots of a small tensor and the ranks all-reduce it:
each then knows every GPU's reading. Rank 0's governor decides for the job, from the
total power and energy against the job's budget (the summed idle power and enforced
limits of its GPUs), the hottest GPU against a temperature limit, and its own step's
work; it broadcasts the duty, and every rank paces at it from that tick on, so no rank
waits at a collective on a peer paced harder. Only the duty is shared: on several GPUs the
controller changes nothing else (flashwatt.control.controller).

The collectives run on a group of the job's ranks made from the job's group when the
controller starts (`torch.distributed.new_group`, gloo, CPU tensors): the sensor's thread
calls them, and a collective from a second thread on the job's own group would interleave
with the step's collectives in an order that differs between ranks. No daemon, no second
rendezvous: the group is the job's ranks on the job's store.

Faults:
- NVML failing on a rank: its power is taken as the mean of the ranks that answered (they
  run the same step at the same duty), its energy as unknown (no window is judged by a
  guess); with no rank answering, the governor's own fallback holds (the frugal point).
- A rank that dies or stops answering: the collective fails (the peer's connection
  closes) or times out after `timeout_s` (a monotonic bound: no rank waits longer). From
  then on each surviving rank holds `budget / world size` alone with a fresh local
  governor, starting from the power prior's low duty, so the job stays within its budget
  without the dead rank's readings. `on_peer_loss` says what the job does: "end" (the next
  `step` raises PeerLost) or "continue" (pacing alone within the share). `fault` records
  which, and when.
- Closing: a rank that closes says so in its last exchange; every rank stops exchanging
  after the exchange that carried it.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from flashwatt.control.configuration import ControlError
from flashwatt.control.governor import Governor, Reading

ON_PEER_LOSS = ("end", "continue")
# Slots per rank in the exchanged tensor: power W, energy J, temperature C, what NVML gave
# (bit 0 power, bit 1 energy, bit 2 temperature), closing (1).
_SLOTS = 5
_POWER, _ENERGY, _TEMP = 1, 2, 4
# The setup's collective (the job's idle powers and limits, when a controller starts) waits
# this long: the ranks reach it as each finishes what came before (the last controller's
# close, a static point's end), seconds apart on GPUs. A tick's exchange waits timeout_s.
SETUP_TIMEOUT_S = 60.0
# How long a rank waits at a pacing point for its peers (flashwatt.control.pacing: the ranks
# agree there on the idle all pay): as long as a peer may spend between two steps (an
# evaluation, a checkpoint). A peer that died fails the collective at once.
PACE_TIMEOUT_S = 300.0


class JobPower:
    """The job's shared budget on one rank (module docstring)."""

    def __init__(self, group: Any, on_peer_loss: str = "end", timeout_s: float | None = None, period_s: float = 0.1):
        import torch.distributed as dist

        if on_peer_loss not in ON_PEER_LOSS:
            raise ControlError(f"on_peer_loss={on_peer_loss!r}: allowed {', '.join(ON_PEER_LOSS)}")
        if not dist.is_initialized():
            raise ControlError("group: a shared budget needs the job's process group to be started")
        self.on_peer_loss = on_peer_loss
        self.timeout_s = float(timeout_s if timeout_s is not None else max(2.0, 20 * period_s))
        ranks = dist.get_process_group_ranks(group)
        self.rank, self.world = ranks.index(dist.get_rank()), len(ranks)
        self.group = dist.new_group(ranks, backend="gloo",
                                    timeout=timedelta(seconds=max(self.timeout_s, SETUP_TIMEOUT_S)))
        # The pacing points' agreement runs on the step's thread: a group of its own, apart
        # from the sensor thread's exchanges.
        self.pace_group = dist.new_group(ranks, backend="gloo", timeout=timedelta(seconds=PACE_TIMEOUT_S))
        self.fault: dict | None = None
        self.finished = False  # a rank closed: no more exchanges
        # The job's governor, kept when this rank goes on alone: once a peer closed first, its
        # tables are still the job's (rank 0 keeps them for the next run, Controller.close).
        self.job_governor: Governor | None = None
        self.local_idle_w: float | None = None
        self.local_limit_w: float | None = None
        self._closing = False
        self._closed = threading.Event()
        self._last: list[dict] = []
        self._events: list[str] = []
        self._t0 = time.monotonic()

    @property
    def shared(self) -> bool:
        return self.fault is None and not self.finished

    # ---- setup --------------------------------------------------------------------------
    def job_totals(self, idle_w: float | None, limit_w: float | None) -> tuple[float | None, float | None]:
        """The job's idle power and enforced limit: every GPU's, summed (None if any is unknown)."""
        self.local_idle_w, self.local_limit_w = idle_w, limit_w
        values = self._reduce([idle_w if idle_w is not None else -1.0, limit_w if limit_w is not None else -1.0],
                              slots=2, timeout_s=max(self.timeout_s, SETUP_TIMEOUT_S))
        idles, limits = values[0::2], values[1::2]
        return (sum(idles) if min(idles) >= 0 else None, sum(limits) if min(limits) >= 0 else None)

    # ---- each tick ----------------------------------------------------------------------
    def exchange(self, reading: Reading, ctl) -> Reading | None:
        """Share this rank's reading; rank 0 gets the job's reading to decide on, the other
        ranks the duty rank 0 decided (applied here) and None. Alone (after a fault, or once
        a rank closed), the local reading."""
        if not self.shared:
            return reading
        mine = [reading.power_w or 0.0, (reading.energy_mj or 0.0) / 1e3, reading.temp_c or 0.0,
                _POWER * (reading.power_w is not None) + _ENERGY * (reading.energy_mj is not None)
                + _TEMP * (reading.temp_c is not None), 1.0 if self._closing else 0.0]
        try:
            values = self._reduce(mine, slots=_SLOTS)
        except Exception as err:  # noqa: BLE001 - a peer died or stopped answering
            self._lose_peers(ctl, err)
            return reading
        self._last = [dict(zip(("power_w", "energy_j", "temp_c", "flags", "closing"),
                               values[r * _SLOTS:(r + 1) * _SLOTS])) for r in range(self.world)]
        if any(slot["closing"] for slot in self._last):
            self.finished = True
            self._closed.set()
            self._go_local(ctl)
            return reading
        if self.rank != 0:
            try:
                ctl.governor.loop.duty = self._broadcast(None)
            except Exception as err:  # noqa: BLE001
                self._lose_peers(ctl, err)
            return None
        return self._job_reading(reading)

    def agree_idle(self, owed_s: float, ctl) -> float:
        """At a pacing point, on every rank: the idle all ranks pay there, the smallest any
        owes (flashwatt.control.pacing). Alone (after a fault, or once a rank closed), this
        rank's own."""
        if not self.shared:
            return owed_s
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([owed_s], dtype=torch.float64)
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.pace_group)
        except Exception as err:  # noqa: BLE001 - a peer died or stopped answering
            self._lose_peers(ctl, err)
            return owed_s
        return float(tensor.item())

    def decided(self, ctl) -> None:
        """Rank 0, after its governor's tick: every rank paces at its duty from now."""
        if self.rank == 0 and self.shared:
            try:
                self._broadcast(ctl.governor.duty)
            except Exception as err:  # noqa: BLE001
                self._lose_peers(ctl, err)

    def _job_reading(self, reading: Reading) -> Reading:
        """The job as one GPU: total power (a silent rank's taken as the others' mean), total
        energy (unknown while a rank is silent), the hottest temperature."""
        powers = [s["power_w"] for s in self._last if int(s["flags"]) & _POWER]
        silent = [r for r, s in enumerate(self._last) if not int(s["flags"]) & _POWER]
        if silent and powers:
            self._events.append(f"no power reading from rank(s) {silent}: taken as the others' mean")
        power = sum(powers) * self.world / len(powers) if powers else None
        energies = [s["energy_j"] for s in self._last if int(s["flags"]) & _ENERGY]
        energy = sum(energies) * 1e3 if len(energies) == self.world else None
        temps = [s["temp_c"] for s in self._last if int(s["flags"]) & _TEMP]
        error = None if powers else "no rank of the job had a power reading"
        return Reading(reading.t, power, energy, max(temps) if temps else None, reading.sm_clock_mhz,
                       reading.clock_reasons, error, gpu_util_pct=reading.gpu_util_pct)  # (this rank's GPU)

    def row(self) -> dict:
        """Every GPU's reading beside the job's, for the trace."""
        out = {"ranks": self.world, "shared": self.shared}
        for r, slot in enumerate(self._last):
            flags = int(slot["flags"])
            out[f"power_w_rank{r}"] = slot["power_w"] if flags & _POWER else None
            out[f"energy_mj_rank{r}"] = slot["energy_j"] * 1e3 if flags & _ENERGY else None
            out[f"temp_c_rank{r}"] = slot["temp_c"] if flags & _TEMP else None
        if self._events:
            out["job_event"] = "; ".join(self._events)
            self._events = []
        return out

    # ---- faults and the end ---------------------------------------------------------------
    def _lose_peers(self, ctl, err: BaseException) -> None:
        action = "ended" if self.on_peer_loss == "end" else "continued"
        self.fault = {"kind": "peer_lost", "rank": self.rank, "at_s": time.monotonic() - self._t0,
                      "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                      "action": action, "timeout_s": self.timeout_s}
        self._go_local(ctl)
        self.fault["budget_share_w"] = ctl.governor.budget_w

    def _go_local(self, ctl) -> None:
        """Hold this rank's share of the job's budget alone, from a fresh governor whose first
        duty the power prior keeps under the share (the job-level tables say nothing of one GPU)."""
        job = ctl.governor
        if job.mode != "budget" or job.budget_w is None:
            return
        self.job_governor = self.job_governor or job
        share = job.budget_w / self.world
        if self.local_idle_w is not None and share <= self.local_idle_w:
            share = self.local_idle_w * 1.05  # the least a running GPU can draw: as frugal as it gets
        ctl.governor = Governor("budget", job.candidates_for, budget_w=share, idle_w=self.local_idle_w,
                                limit_w=self.local_limit_w, duty_range=(job.loop.d_min, job.loop.d_max),
                                clock=job.clock)

    def close(self, threaded: bool, ctl) -> None:
        """Say this rank is closing: in the sensor thread's next exchange (waited for, at
        most the timeout), or in one of its own where no thread exchanges."""
        if not self.shared:
            return
        self._closing = True
        if threaded:
            self._closed.wait(self.timeout_s)
        else:
            self.exchange(Reading(time.monotonic(), None), ctl)

    # ---- collectives ---------------------------------------------------------------------
    def _reduce(self, mine: list[float], slots: int, timeout_s: float | None = None) -> list[float]:
        import torch
        import torch.distributed as dist

        tensor = torch.zeros(self.world * slots, dtype=torch.float64)
        tensor[self.rank * slots:(self.rank + 1) * slots] = torch.tensor(mine, dtype=torch.float64)
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        work.wait(timeout=timedelta(seconds=timeout_s or self.timeout_s))
        return tensor.tolist()

    def _broadcast(self, duty: float | None) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([duty if duty is not None else 0.0], dtype=torch.float64)
        work = dist.broadcast(tensor, group=self.group, group_src=0, async_op=True)
        work.wait(timeout=timedelta(seconds=self.timeout_s))
        return float(tensor.item())
