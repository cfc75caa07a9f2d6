"""Which rank ended a cell, and what its record says, from how every rank ended
(flashwatt.distributed.rank_fate and the supervisor's outcome), on constructed fates."""
from __future__ import annotations

import pytest

from flashwatt.distributed.rank_fate import RankFate, cause, how, read_watchdog_report, status_of
from flashwatt.distributed.rank_supervisor import RanksOutcome
from flashwatt.distributed.rendezvous import NodeLayout
from flashwatt.submit.failure_policy import FailurePolicy

GLOO_RESET = "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:6012: Connection reset by peer"
GLOO_TIMEOUT = "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 7000ms for recv operation to complete"


def fate(rank, state, ended_s=1.0, **more) -> RankFate:
    return RankFate(rank, rank, 0, "h", 100 + rank, state=state, ended_s=ended_s, **more)


def outcome(*fates) -> RanksOutcome:
    return RanksOutcome(list(fates), FailurePolicy(14, 2), NodeLayout(1, 0, len(fates), "127.0.0.1", 1, "h"),
                        seconds=9.0)


def test_a_killed_rank_is_the_cause_not_the_peers_that_lost_it():
    # The peers saw the dead rank's socket close first, and say so a little earlier.
    fates = [fate(0, "raised", 0.9, exception="RuntimeError", message=GLOO_RESET),
             fate(1, "signal", 1.0, signal="SIGKILL", exit_code=-9),
             fate(2, "raised", 0.95, exception="DistBackendError", message="NCCL error: remote process exited")]
    culprit = cause(fates)
    assert culprit.rank == 1 and status_of(culprit) == "job_failed" and how(culprit, []) == "signal"
    assert "rank 1 (pid 101, h) killed by SIGKILL" in outcome(*fates).reason()


def test_an_exception_of_the_rank_itself_comes_before_communication_errors():
    fates = [fate(0, "raised", 0.5, exception="RuntimeError", message=GLOO_RESET),
             fate(1, "raised", 0.7, exception="OutOfMemoryError", message="CUDA out of memory", oom=True,
                  stage="timed steps")]
    culprit = cause(fates)
    assert culprit.rank == 1 and status_of(culprit) == "oom" and how(culprit, []) == "oom"
    assert "raised OutOfMemoryError during timed steps" in culprit.describe()


def test_a_timeout_names_the_ranks_still_running_as_not_answering():
    got = outcome(fate(0, "raised", 7.1, exception="RuntimeError", message=GLOO_TIMEOUT), fate(1, "stopped", 7.3))
    assert got.culprit.rank == 0 and got.status() == "error" and got.not_answering == [1]
    fields = got.record_fields()
    assert fields["how"] == "timeout" and fields["not_answering"] == [1] and fields["failed_rank"] == 0
    assert "rank(s) 1 did not answer" in got.reason() and "rank(s) 1 stopped by the supervisor" in got.reason()


def test_a_rank_unblocked_by_the_waiting_ranks_exit_is_named_as_not_answering():
    # Rank 1 sat in a receive nobody sent to; rank 0 timed out in the barrier and exited, which
    # closed rank 1's connection. Rank 2 waited in the barrier too and timed out with rank 0.
    got = outcome(fate(0, "raised", 8.0, exception="RuntimeError", message=GLOO_TIMEOUT),
                  fate(1, "raised", 8.3, exception="RuntimeError", message="[gloo/transport/tcp/pair.cc:553] "
                                                                             "Connection closed by peer"),
                  fate(2, "raised", 8.1, exception="RuntimeError", message=GLOO_TIMEOUT))
    assert got.culprit.rank == 0 and got.not_answering == [1] and got.record_fields()["how"] == "timeout"


def test_the_nccl_watchdogs_abort_is_a_timeout_not_a_kill():
    got = outcome(fate(0, "signal", 24.0, signal="SIGABRT", exit_code=-6), fate(1, "stopped", 24.2),
                  fate(2, "signal", 24.05, signal="SIGABRT", exit_code=-6))
    assert got.culprit.rank == 0 and got.status() == "error" and got.not_answering == [1]
    assert got.record_fields()["how"] == "timeout" and "NCCL watchdog" in got.reason()


def _monitor_line(rank: int, source: str, enqueued: int, completed: int, pg: str = "0(default_pg)") -> str:
    """A line as ProcessGroupNCCL's heartbeat monitor writes it to a rank's stderr."""
    return (f"[rank{rank}]:[E1126 18:02:11.108 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID {pg} Rank {rank}] "
            f"Received a dump signal due to a collective timeout from {source} and we will try our best to dump "
            f"the debug info. Last enqueued NCCL work: {enqueued}, last completed NCCL work: {completed}.This is "
            "most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks\n")


def test_the_watchdogs_line_says_whose_timeout_ended_the_rank():
    text = "noise\n" + _monitor_line(1, "rank 0", 41, 41) + "[rank1]: terminate called\n"
    assert read_watchdog_report(text) == {"pg": "0(default_pg)", "from_rank": 0, "last_enqueued": 41,
                                          "last_completed": 41}
    assert read_watchdog_report(_monitor_line(0, "this local rank", 42, 41))["from_rank"] is None
    assert read_watchdog_report("Traceback (most recent call last):\n  ValueError\n") is None


def test_over_nccl_the_rank_that_hung_is_told_apart_by_what_it_enqueued():
    # Rank 1 hung outside any collective; rank 0 timed out in collective 42 and its watchdog
    # told rank 1's, which ended rank 1 with SIGABRT 1.8 s later: both end the same way.
    waiting = fate(0, "signal", 34.9, signal="SIGABRT", exit_code=-6,
                   watchdog=read_watchdog_report(_monitor_line(0, "this local rank", 42, 41)))
    hung = fate(1, "signal", 36.7, signal="SIGABRT", exit_code=-6,
                watchdog=read_watchdog_report(_monitor_line(1, "rank 0", 41, 41)))
    got = outcome(waiting, hung)
    assert got.culprit.rank == 0 and got.not_answering == [1] and got.record_fields()["how"] == "timeout"
    assert "rank(s) 1 did not answer" in got.reason()
    # A rank that had enqueued the collective was waiting in it too: it answered.
    answered = fate(1, "signal", 35.0, signal="SIGABRT", exit_code=-6,
                    watchdog=read_watchdog_report(_monitor_line(1, "rank 0", 42, 41)))
    assert outcome(waiting, answered).not_answering == []
    # Sequence numbers of two different groups say nothing about each other.
    other_group = fate(1, "signal", 36.7, signal="SIGABRT", exit_code=-6,
                       watchdog=read_watchdog_report(_monitor_line(1, "rank 0", 3, 3, pg="2(zigzag)")))
    assert outcome(waiting, other_group).not_answering == []


def test_a_clean_end_is_not_a_failure():
    got = outcome(fate(0, "ok"), fate(1, "ok"))
    assert not got.failed and got.culprit is None and got.record_fields()["failed"] is False


@pytest.mark.parametrize("state, status", [("exit", "job_failed"), ("signal", "job_failed"), ("raised", "error")])
def test_the_status_follows_the_projects_meanings(state, status):
    extra = {"signal": "SIGSEGV"} if state == "signal" else {"exception": "ValueError", "message": "bad"} \
        if state == "raised" else {"exit_code": 3}
    assert status_of(fate(0, state, **extra)) == status
