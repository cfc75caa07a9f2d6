"""How each rank of a cell ended, which rank's end was the cause, and what the record says.

A cell's ranks end one of these ways (`RankFate.state`):

    ok        exit status 0
    raised    an exception (its type, message, traceback, stage, whether out of memory)
    signal    killed by a signal nobody in the cell sent (SIGKILL from outside, the OOM
              killer, SIGABRT from the NCCL watchdog)
    exit      another non-zero exit status, with no exception recorded
    stopped   still running when the supervisor began stopping the cell's ranks

When several ranks ended badly, the cause is the first of: a rank killed by a signal;
a rank that raised an exception that is not a communication error (out of memory, a bug);
a rank with another exit status; then a communication error (a collective timing out,
a connection closed by a peer), which is what the other ranks see once one of them is
gone. SIGABRT counts as a communication error: it is how PyTorch's NCCL watchdog ends a
rank whose collective timed out or failed (TORCH_NCCL_ASYNC_ERROR_HANDLING=3).

When a collective timed out, the ranks that did not answer it are named (`not_answering`):
those still running when the supervisor stopped them (hung, or never joined), and those
that ended by another communication error after the first timeout, a connection closed by
the waiting ranks' exit (gloo tells a rank blocked in a receive that its peer is gone). A
rank that timed out too was waiting with the others.

Over NCCL the watchdog of the rank whose collective timed out tells every other rank
through the store, and their heartbeat monitors end them with SIGABRT too, the rank that
hung included; all end the same way. What tells them apart is the line each monitor
writes to its rank's stderr before the abort (`read_watchdog_report`): the rank the
signal came from ("this local rank" for the one that timed out) and the process group's
last enqueued and last completed collective. A rank ended for another rank's timeout that
never enqueued the collective that timed out (its last enqueued sequence number is below
the waiting rank's first incomplete one, on the same group) did not answer it.

The record's status follows the project's meanings: `oom` for an out-of-memory error,
`error` for any other exception (a timeout included: the waiting rank raised it, or the
watchdog ended it), and `job_failed` for a rank that died without returning (a signal,
an exit status).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

COMMUNICATION_HINTS = ("gloo/", "nccl", "timed out", "connection reset", "connection closed", "socket timeout",
                       "watchdog", "failed to recv", "failed to send", "broken pipe")
COMMUNICATION_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "DistQueueEmptyError")
_MESSAGE_CHARS = 600
WATCHDOG_SIGNAL = "SIGABRT"
# ProcessGroupNCCL's heartbeat monitor, on a collective timeout seen by this rank or another
# ("Last enqueued NCCL work" in PyTorch 2.x; newer versions name the backend the same way).
_WATCHDOG_REPORT = re.compile(
    r"\[PG ID (?P<pg_id>\S+) PG GUID (?P<pg>[^\]]*?) Rank (?P<rank>\d+)\] Received a dump signal due to a "
    r"collective timeout from\s+(?P<source>this local rank|rank\s+\d+).*?"
    r"Last enqueued \w*\s?work: (?P<enqueued>-?\d+), last completed \w*\s?work: (?P<completed>-?\d+)")


def read_watchdog_report(text: str) -> dict | None:
    """What a rank's NCCL heartbeat monitor said before it ended the rank (module docstring):
    {"pg", "from_rank" (None: this rank's own collective timed out), "last_enqueued",
    "last_completed"}, from the last such line of `text`; None when there is none."""
    found = None
    for found in _WATCHDOG_REPORT.finditer(text):
        pass
    if found is None:
        return None
    source = found["source"]
    return {"pg": found["pg"], "from_rank": None if source == "this local rank" else int(source.split()[-1]),
            "last_enqueued": int(found["enqueued"]), "last_completed": int(found["completed"])}


@dataclass
class RankFate:
    rank: int
    local_rank: int
    node: int
    host: str
    pid: int | None
    state: str = "running"
    exit_code: int | None = None
    signal: str | None = None
    ended_s: float | None = None  # seconds after the ranks started, when the supervisor saw the end
    exception: str | None = None
    message: str | None = None
    oom: bool = False
    stage: str | None = None
    watchdog: dict | None = None  # read_watchdog_report of its stderr, after a watchdog abort
    traceback: str | None = field(default=None, repr=False)

    @property
    def watchdog_abort(self) -> bool:
        return self.state == "signal" and self.signal == WATCHDOG_SIGNAL

    @property
    def ended_for_another(self) -> bool:
        """Ended by the watchdog because another rank's collective timed out."""
        return self.watchdog_abort and self.watchdog is not None and self.watchdog["from_rank"] is not None

    @property
    def communication_error(self) -> bool:
        if self.watchdog_abort:
            return True
        text = (self.message or "").lower()
        return self.exception in COMMUNICATION_TYPES or any(h in text for h in COMMUNICATION_HINTS)

    @property
    def timed_out(self) -> bool:
        """A collective (or the rendezvous) this rank waited in timed out."""
        return (self.watchdog_abort and not self.ended_for_another) or (self.state == "raised" and "timed out" in (self.message or "").lower())

    @property
    def bad(self) -> bool:
        return self.state not in ("ok", "running", "stopped")

    def as_row(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k != "traceback" and v is not None}
        if self.message:
            row["message"] = self.message[:_MESSAGE_CHARS]
        return row

    def where(self) -> str:
        return f"rank {self.rank} (pid {self.pid}, {self.host})"

    def describe(self) -> str:
        """'rank 1 (pid 42, host) killed by SIGKILL 3.1 s in' and the like."""
        when = f" {self.ended_s:.1f} s in" if self.ended_s is not None else ""
        if self.watchdog_abort:
            return (f"{self.where()} ended by {self.signal}{when} (PyTorch's NCCL watchdog: a collective timed out "
                    "or failed)")
        if self.state == "signal":
            return f"{self.where()} killed by {self.signal}{when}"
        if self.state == "raised":
            stage = f" during {self.stage}" if self.stage else ""
            first = (self.message or "").splitlines()[0] if self.message else ""
            return f"{self.where()} raised {self.exception}{stage}{when}: {first[:300]}"
        if self.state == "exit":
            return f"{self.where()} exited with status {self.exit_code}{when}"
        return f"{self.where()} {self.state}"


def _cause_order(fate: RankFate) -> tuple[int, float]:
    if fate.state == "signal" and not fate.watchdog_abort:
        kind = 0
    elif fate.state == "raised" and not fate.communication_error:
        kind = 1
    elif fate.state == "exit":
        kind = 2
    elif not fate.ended_for_another:
        kind = 3
    else:
        kind = 4  # its watchdog only passed on another rank's timeout
    return kind, fate.ended_s if fate.ended_s is not None else float("inf")


def cause(fates: list[RankFate]) -> RankFate | None:
    """The rank whose end ended the cell (module docstring), or None when none ended badly."""
    bad = [f for f in fates if f.bad]
    return min(bad, key=_cause_order) if bad else None


def status_of(culprit: RankFate) -> str:
    if culprit.state == "raised":
        return "oom" if culprit.oom else "error"
    return "error" if culprit.watchdog_abort else "job_failed"


def _never_enqueued(fate: RankFate, by_rank: dict[int, RankFate]) -> bool:
    """An NCCL rank ended for another's timeout that never enqueued the collective that timed
    out on the same group (module docstring)."""
    if not fate.ended_for_another:
        return False
    source = by_rank.get(fate.watchdog["from_rank"])
    if source is None or source.watchdog is None or source.watchdog["pg"] != fate.watchdog["pg"]:
        return False
    return fate.watchdog["last_enqueued"] <= source.watchdog["last_completed"]


def not_answering(fates: list[RankFate]) -> list[int]:
    """The ranks that did not answer a collective that timed out (module docstring)."""
    timed_out = [f.ended_s or 0.0 for f in fates if f.timed_out]
    if not timed_out:
        return []
    first = min(timed_out)
    by_rank = {f.rank: f for f in fates}
    return sorted(f.rank for f in fates if f.state == "stopped" or _never_enqueued(f, by_rank) or (
        f.state == "raised" and f.communication_error and not f.timed_out and (f.ended_s or 0.0) >= first))


def how(culprit: RankFate, not_answering: list[int]) -> str:
    """One word for the record: signal, oom, exception, exit, timeout or communication."""
    if culprit.state == "signal" and not culprit.watchdog_abort:
        return "signal"
    if culprit.state == "exit":
        return "exit"
    if culprit.oom:
        return "oom"
    if culprit.communication_error:
        return "timeout" if not_answering or "timed out" in (culprit.message or "").lower() else "communication"
    return "exception"
