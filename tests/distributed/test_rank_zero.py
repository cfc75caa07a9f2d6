"""The other ranks wait on rank 0 working alone longer than any collective may wait, and no
longer than the solo-phase timeout (flashwatt.distributed.rank_zero): two gloo ranks whose
process group times out after 8 s, rank 0 working alone 10 s."""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from flashwatt.submit.failure_policy import ENV_FAILURE_TIMEOUT, ENV_SOLO_PHASE_TIMEOUT, ENV_STOP_GRACE, FailurePolicy
from support import free_ports

pytestmark = pytest.mark.slow  # a gloo process group per test, each rank importing torch

ALONE_S = 10.0


def _rank(rank: int, port: int, out: str) -> None:
    import time

    import torch.distributed as dist

    from flashwatt.distributed import rank_zero, rendezvous

    rendezvous.start(rendezvous.from_environment(rank, 2, rank, "127.0.0.1", port))
    started = time.monotonic()
    if rank == 0:
        time.sleep(ALONE_S)  # a float64 reference, a one-GPU baseline
    try:
        got = {"value": rank_zero.from_rank_zero({"from": rank}), "waited_s": time.monotonic() - started}
    except RuntimeError as error:
        got = {"error": str(error), "waited_s": time.monotonic() - started}
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(got, fh)
    if "error" not in got:
        dist.barrier()
    dist.destroy_process_group()
    rank_zero.forget()


def _two_ranks(tmp_path, monkeypatch, solo_s: float) -> dict:
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, "18")
    monkeypatch.setenv(ENV_STOP_GRACE, "2")
    monkeypatch.setenv(ENV_SOLO_PHASE_TIMEOUT, str(solo_s))
    assert FailurePolicy.from_environment().detect_s < ALONE_S  # the default group would time out first
    out = str(tmp_path / "got")
    mp.spawn(_rank, args=(free_ports(1)[0], out), nprocs=2, join=False).join(timeout=120)
    return json.loads((tmp_path / "got.1").read_text())


def test_the_others_wait_on_rank_zero_alone_past_the_collective_timeout(tmp_path, monkeypatch):
    got = _two_ranks(tmp_path, monkeypatch, solo_s=60)
    assert got["value"] == {"from": 0} and got["waited_s"] >= ALONE_S - 1


def test_and_no_longer_than_the_solo_phase_timeout(tmp_path, monkeypatch):
    got = _two_ranks(tmp_path, monkeypatch, solo_s=3)
    assert "error" in got and "timed out" in got["error"].lower() and got["waited_s"] < ALONE_S
