"""Rank and rendezvous from arguments, torchrun, submitit's local executor and Slurm variables."""
from __future__ import annotations

import random

import pytest

from flashwatt.distributed.rendezvous import from_environment

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_LOCAL_GLOBALID",
               "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_JOB_ID",
               "SUBMITIT_LOCAL_JOB_NUM_NODES", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
               "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "NNODES")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def test_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "node7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    r = from_environment()
    assert (r.rank, r.world, r.local_rank, r.addr, r.port) == (3, 8, 1, "node7", 29500)


def test_submitit_local_executor_ranks_share_a_port_from_the_job_id(monkeypatch):
    monkeypatch.setenv("SUBMITIT_LOCAL_GLOBALID", "1")
    monkeypatch.setenv("SUBMITIT_LOCAL_NTASKS", "2")
    monkeypatch.setenv("SUBMITIT_LOCAL_LOCALID", "1")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "4242")
    r = from_environment()
    assert (r.rank, r.world, r.local_rank, r.addr) == (1, 2, 1, "127.0.0.1")
    assert r.port == random.Random("4242").randint(20000, 60000)


def test_slurm_variables_with_master_set(monkeypatch):
    for name, value in {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_NNODES": "2",
                        "SLURM_JOB_ID": "77", "MASTER_ADDR": "gpu01"}.items():
        monkeypatch.setenv(name, value)
    r = from_environment()
    assert (r.rank, r.world, r.local_rank, r.addr, r.nodes) == (5, 16, 5, "gpu01", 2)
    assert r.port == random.Random("77").randint(20000, 60000)


def test_arguments_win_and_a_lone_process_needs_no_launcher():
    r = from_environment(rank=1, world=2, local_rank=0, addr="h", port=1234)
    assert (r.rank, r.world, r.local_rank, r.addr, r.port) == (1, 2, 0, "h", 1234)
    alone = from_environment()
    assert (alone.rank, alone.world) == (0, 1) and alone.port > 0
    with pytest.raises(ValueError, match="MASTER_PORT"):
        from_environment(rank=0, world=2)
