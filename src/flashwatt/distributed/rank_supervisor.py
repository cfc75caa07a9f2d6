"""The parent that owns a cell's ranks: it starts them, watches them, and ends all of them
when one ends badly, within the failure policy's bound (flashwatt.submit.failure_policy).

    outcome = run_ranks("package.module:function", args, layout, policy)

One job task per node runs this. It starts the node's `layout.per_node` ranks with
PyTorch's elastic launcher (torch.distributed.elastic.multiprocessing.start_processes, a
binary entry point: `python -m flashwatt.distributed.rank_process`), which puts every rank
in a process group of its own and ends a rank by signalling that whole group. Each rank
gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, the
failure policy and PyTorch's NCCL watchdog settings, and dies with its parent.

Then it polls the ranks every POLL_S seconds:

- a rank that ends badly (a signal, an exception, another exit status), an abort from
  another node (flashwatt.distributed.node_watch), or ranks still running more than the
  collective timeout after another finished cleanly: the supervisor stops every rank
  still running, SIGTERM to its process group, SIGKILL `stop_grace_s` later, then SIGKILL
  to every rank's process group again, so no child of a rank survives it either;
- SIGINT (Ctrl-C, a local job's cancel), SIGTERM (scancel, srun ending the step's tasks)
  or SIGHUP reaching the supervisor: the same, then the signal goes on as usual
  (KeyboardInterrupt, or SystemExit(128 + signal)).

A rank that hangs, or never joins, is ended by the others: they wait at most the collective
timeout in a collective (or in the rendezvous) before they raise or the NCCL watchdog ends
them, and their end ends the cell. The outcome says how every rank ended and which one was
the cause (flashwatt.distributed.rank_fate); `RanksOutcome.record_fields()` is what the cell's
record keeps of it.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from flashwatt.submit.failure_policy import FailurePolicy
from flashwatt.distributed.node_watch import NodeWatch
from flashwatt.distributed.rank_fate import RankFate, cause, how, not_answering, read_watchdog_report, status_of
from flashwatt.distributed.rank_process import ENV_SUPERVISOR_PID, failure_path, result_path
from flashwatt.distributed.rendezvous import MULTICAST_OFF, NodeLayout

POLL_S = 0.1
# After a rank's collective times out, how long the other ranks still running get to end on
# their own: those waiting in the same collective time out too; those that do not are the
# ones not answering (hung, or never joined). Within failure_policy.MONITOR_SLACK_S.
SETTLE_S = 2.0
RANK_MODULE = "flashwatt.distributed.rank_process"


@dataclass
class RanksOutcome:
    """How a cell's ranks ended; `result` is rank 0's return value (on the first node)."""
    fates: list[RankFate]
    policy: FailurePolicy
    layout: NodeLayout
    result: Any = None
    seconds: float = 0.0
    stop: str | None = None            # why the supervisor stopped the ranks, if it did
    stop_began_s: float | None = None  # when, seconds after the start
    silent_nodes: list[int] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.stop is not None or any(f.bad for f in self.fates) or bool(self.silent_nodes)

    @property
    def culprit(self) -> RankFate | None:
        return cause(self.fates)

    @property
    def not_answering(self) -> list[int]:
        """The ranks that did not answer a collective that timed out (flashwatt.distributed.rank_fate)."""
        culprit = self.culprit
        if culprit is None or not culprit.communication_error:
            return []
        return not_answering(self.fates)

    def status(self) -> str:
        culprit = self.culprit
        return status_of(culprit) if culprit is not None else "error"

    def reason(self) -> str:
        culprit = self.culprit
        if culprit is None:
            first = self.stop or f"node(s) {self.silent_nodes} never reported their ranks' end"
        else:
            first = culprit.describe()
        stopped = [f.rank for f in self.fates if f.state == "stopped"]
        parts = [first]
        if self.not_answering:
            parts.append(f"rank(s) {', '.join(map(str, self.not_answering))} did not answer the collective that "
                         "timed out (hung, or never joined)")
        if stopped:
            parts.append(f"rank(s) {', '.join(map(str, stopped))} stopped by the supervisor")
        parts.append(f"the cell ended {self.seconds:.1f} s after its ranks started "
                     f"(bound {self.policy.failure_timeout_s:g} s after a failure)")
        return "; ".join(parts)

    def record_fields(self) -> dict:
        """The record's `ranks`: every rank's end, the cause and the timing of the stop."""
        culprit = self.culprit
        out = {"world": self.layout.world, "nodes": self.layout.nodes, "failed": self.failed,
               "policy": self.policy.as_dict(), "seconds": round(self.seconds, 3),
               "per_rank": [f.as_row() for f in sorted(self.fates, key=lambda f: f.rank)]}
        if self.stop is not None:
            out["stop"] = self.stop
            out["stop_began_s"] = self.stop_began_s
        if culprit is not None:
            out.update(failed_rank=culprit.rank, how=how(culprit, self.not_answering), failed_after_s=culprit.ended_s)
            if culprit.stage:
                out["stage"] = culprit.stage
            if culprit.ended_s is not None and culprit.node == self.layout.node:
                out["ended_s_after_failure"] = round(self.seconds - culprit.ended_s, 3)
        if self.not_answering:
            out["not_answering"] = self.not_answering
        if self.silent_nodes:
            out["silent_nodes"] = self.silent_nodes
        return out

    def traceback(self) -> str | None:
        culprit = self.culprit
        return culprit.traceback if culprit is not None else None


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) while the ranks run (SIGINT raises
    KeyboardInterrupt already), so that the teardown in `finally` runs. submitit's task
    ignores SIGTERM otherwise, which would leave the ranks to Slurm's SIGKILL."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def raise_exit(signum, _frame):
        raise SystemExit(128 + signum)

    for s in previous:
        signal.signal(s, raise_exit)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _die_with_parent() -> None:
    """SIGTERM this supervisor when the process that started it dies (a local job's controller
    killed outright): its `finally` then stops the ranks."""
    from flashwatt.distributed.rank_process import PR_SET_PDEATHSIG

    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _rank_environments(layout: NodeLayout, policy: FailurePolicy) -> dict[int, dict[str, str]]:
    common = {"WORLD_SIZE": str(layout.world), "LOCAL_WORLD_SIZE": str(layout.per_node), "NNODES": str(layout.nodes),
              "GROUP_RANK": str(layout.node), "MASTER_ADDR": layout.addr, "MASTER_PORT": str(layout.port),
              ENV_SUPERVISOR_PID: str(os.getpid()), "PYTHONUNBUFFERED": "1", **MULTICAST_OFF,
              **policy.rank_environment()}
    return {local: {**common, "RANK": str(layout.rank_of(local)), "LOCAL_RANK": str(local)}
            for local in range(layout.per_node)}


def _start(target: str, args: tuple, layout: NodeLayout, policy: FailurePolicy, workdir: Path):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

    call = workdir / "call.pkl"
    call.write_bytes(pickle.dumps((target, tuple(args))))
    envs = _rank_environments(layout, policy)
    entry = ("-m", RANK_MODULE, str(call), str(workdir))
    return start_processes(name=f"flashwatt-{target.rpartition(':')[2]}", entrypoint=sys.executable,
                           args={local: entry for local in envs}, envs=envs,
                           # stderr to a file per rank (_StderrCopy copies it to the cell's log):
                           # after a watchdog abort, its last lines say whose timeout it was
                           logs_specs=DefaultLogsSpecs(log_dir=str(workdir / "elastic"), redirects=Std.ERR))


class _StderrCopy:
    """Copies every rank's stderr file to this process's stderr (the cell's log) as it grows,
    whole lines at a time, from a daemon thread. PyTorch's own tee runs its tailers in a
    thread pool that interpreter exit waits for: an interrupted supervisor would never exit,
    and its ranks, which end with it (PR_SET_PDEATHSIG), would live on."""

    def __init__(self, paths: dict[int, str]):
        self.paths, self.done = paths, threading.Event()
        self.thread = threading.Thread(target=self._run, name="flashwatt-rank-stderr", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        handles, partial = {}, dict.fromkeys(self.paths, "")
        try:
            while True:
                last_round = self.done.is_set()
                moved = False
                for local, path in self.paths.items():
                    if local not in handles:
                        try:
                            handles[local] = open(path, errors="replace")  # noqa: SIM115 (closed below)
                        except OSError:
                            continue  # not created yet
                    text = partial[local] + handles[local].read()
                    cut = len(text) if last_round else text.rfind("\n") + 1
                    if cut:
                        sys.stderr.write(text[:cut])
                        moved = True
                    partial[local] = text[cut:]
                if moved:
                    sys.stderr.flush()
                if last_round:
                    return
                if not moved:
                    time.sleep(POLL_S)
        finally:
            for handle in handles.values():
                handle.close()

    def close(self, timeout_s: float = 2.0) -> None:
        self.done.set()
        self.thread.join(timeout_s)


class _Watch:
    """The poll loop's state: every rank's fate as it ends."""

    def __init__(self, context, layout: NodeLayout, workdir: Path):
        self.context, self.workdir, self.t0 = context, workdir, time.monotonic()
        self.handlers = context.subprocess_handlers
        self.fates = {local: RankFate(layout.rank_of(local), local, layout.node, layout.host,
                                      self.handlers[local].proc.pid) for local in self.handlers}
        self.first_clean_end: float | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def running(self) -> list[int]:
        return [local for local, fate in self.fates.items() if fate.state == "running"]

    def poll(self) -> None:
        for local in self.running():
            code = self.handlers[local].proc.poll()
            if code is not None:
                self._ended(self.fates[local], code, self.now())

    def _ended(self, fate: RankFate, code: int, when: float) -> None:
        fate.exit_code, fate.ended_s = code, round(when, 3)
        failure = failure_path(self.workdir, fate.rank)
        if code == 0:
            fate.state = "ok"
            self.first_clean_end = self.first_clean_end if self.first_clean_end is not None else when
        elif code < 0:
            fate.state, fate.signal = "signal", signal.Signals(-code).name
            if fate.watchdog_abort:
                fate.watchdog = self._watchdog_report(fate)
        elif failure.exists():
            data = json.loads(failure.read_text())
            fate.state = "raised"
            for key in ("exception", "message", "oom", "stage", "traceback"):
                setattr(fate, key, data.get(key))
        else:
            fate.state = "exit"

    def _watchdog_report(self, fate: RankFate) -> dict | None:
        stderr = self.context.stderrs.get(fate.local_rank)
        try:
            return read_watchdog_report(Path(stderr).read_text(errors="replace")) if stderr else None
        except OSError:
            return None

    def stop_running(self, grace_s: float) -> None:
        """SIGTERM every running rank's process group, SIGKILL after `grace_s` (PyTorch's
        PContext.close); the ranks it stopped are marked so."""
        for local in self.running():
            self.fates[local].state = "stopping"
        self.context.close(signal.SIGTERM, timeout=max(1, int(round(grace_s))))
        for local, fate in self.fates.items():
            if fate.state == "stopping":
                code = self.handlers[local].proc.poll()
                fate.state, fate.exit_code, fate.ended_s = "stopped", code, round(self.now(), 3)
                fate.signal = signal.Signals(-code).name if code is not None and code < 0 else None

    def sweep(self) -> None:
        """SIGKILL every rank's process group once more: a child a rank left behind (a compile
        worker, say) dies with the cell too."""
        self.context.close(signal.SIGKILL, timeout=1)
        for handler in self.handlers.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handler.proc.pid, signal.SIGKILL)


# Why the ranks were stopped: a rank of this node (its fate says how), another node, a straggler.
LOCAL_FAILURE, REMOTE, STRAGGLER, INTERRUPTED = "rank", "remote", "straggler", "interrupted"


def _why_stop(watch: _Watch, nodes: NodeWatch, policy: FailurePolicy) -> tuple[str, str] | None:
    """(kind, why) the ranks must be stopped now, or None (all still fine, or all ended cleanly)."""
    bad = [f for f in watch.fates.values() if f.bad]
    if bad:
        first = min(f.ended_s or 0.0 for f in bad)
        if all(f.communication_error for f in bad) and watch.running() and watch.now() - first < SETTLE_S:
            return None  # the ranks waiting in the same collective time out too (SETTLE_S)
        return LOCAL_FAILURE, "a rank ended badly"
    remote = nodes.abort_seen()
    if remote:
        return REMOTE, remote
    if watch.running() and watch.first_clean_end is not None \
            and watch.now() - watch.first_clean_end > policy.detect_s:
        return STRAGGLER, (f"rank(s) {', '.join(str(watch.fates[r].rank) for r in watch.running())} still running "
                           f"{policy.detect_s:g} s after another rank finished")
    return None


def _supervise(watch: _Watch, nodes: NodeWatch, policy: FailurePolicy) -> tuple[tuple[str, str] | None, float | None]:
    """Poll until every rank has ended or the ranks must be stopped; ((kind, why) or None,
    when the stop began)."""
    stop, began = None, None
    try:
        while True:
            watch.poll()
            stop = _why_stop(watch, nodes, policy)
            if stop is not None or not watch.running():
                break
            time.sleep(POLL_S)
    except BaseException as interrupt:
        stop = INTERRUPTED, f"the supervisor got {type(interrupt).__name__}"
        raise
    finally:
        if stop is not None and stop[0] in (LOCAL_FAILURE, STRAGGLER):
            nodes.tell_abort()
        if watch.running():
            began = watch.now()
            watch.stop_running(policy.stop_grace_s)
        watch.sweep()
    return stop, began


def run_ranks(target: str, args: tuple, layout: NodeLayout, policy: FailurePolicy | None = None) -> RanksOutcome:
    """Run `target(*args)` on this node's ranks of the cell; how they ended (module docstring).
    Raises KeyboardInterrupt or SystemExit when a signal reached this process, after every
    rank is stopped."""
    policy = policy or FailurePolicy.from_environment()
    _die_with_parent()
    nodes = NodeWatch.over_store(layout, policy.timeout_for("store")) if layout.nodes > 1 else NodeWatch.alone(layout)
    workdir = Path(tempfile.mkdtemp(prefix="flashwatt-ranks-"))
    try:
        with _signals_end_the_wait():
            watch = _Watch(_start(target, args, layout, policy, workdir), layout, workdir)
            copy = _StderrCopy(dict(watch.context.stderrs))
            try:
                stop, began = _supervise(watch, nodes, policy)
            finally:
                copy.close()
        fates = list(watch.fates.values())
        nodes.tell_ended(fates)
        remote, silent = nodes.other_nodes(policy.failure_timeout_s)
        outcome = RanksOutcome(fates + remote, policy, layout, seconds=watch.now(),
                               stop=stop[1] if stop is not None and stop[0] != LOCAL_FAILURE else None,
                               stop_began_s=began, silent_nodes=silent)
        zero = result_path(workdir, 0)
        if layout.node == 0 and zero.exists():
            outcome.result = pickle.loads(zero.read_bytes())
        return outcome
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
