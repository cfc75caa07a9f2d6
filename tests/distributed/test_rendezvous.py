"""Rank and rendezvous from arguments, torchrun, submitit's local executor and Slurm variables."""
from __future__ import annotations

import os
import random
import re

import pytest

from flashwatt.distributed.rendezvous import from_environment, node_layout

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_LOCAL_GLOBALID",
               "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_JOB_ID",
               "SUBMITIT_LOCAL_JOB_NUM_NODES", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
               "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "NNODES", "SLURM_NODEID")


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


# ---- a node's place in a cell over several nodes (the rank supervisor's layout) ----------
@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """An `scontrol` on PATH that expands a node list the way Slurm's does for this one."""
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_a_slurm_task_finds_its_node_and_rank_zero_on_the_first_host(monkeypatch, scontrol):
    for name, value in {"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "77",
                        "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(name, value)
    layout = node_layout(8, nodes=2)
    assert (layout.nodes, layout.node, layout.per_node, layout.world, layout.addr) == (2, 1, 4, 8, "gpu07")
    assert [layout.rank_of(local) for local in range(4)] == [4, 5, 6, 7]
    # Every node draws the same port from the job id; no node needs to tell the others.
    assert layout.port == random.Random("77").randint(20000, 60000)


def test_master_addr_and_port_win_over_slurms_node_list(monkeypatch):
    for name, value in {"SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "MASTER_ADDR": "head",
                        "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(name, value)
    layout = node_layout(4, nodes=2)
    assert (layout.node, layout.addr, layout.port) == (0, "head", 29511)


def test_one_node_needs_no_slurm_and_takes_a_free_port(monkeypatch):
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "31")
    monkeypatch.setenv("SLURM_NODEID", "3")  # inherited from an allocation the local executor runs inside
    layout = node_layout(2)
    assert (layout.nodes, layout.node, layout.per_node, layout.addr) == (1, 0, 2, "127.0.0.1") and layout.port > 0


@pytest.mark.parametrize("processes, nodes, env, message", [
    (6, 4, {}, "cannot be split evenly over 4 nodes"),
    (8, 2, {"SLURM_NODEID": "0", "SLURM_NNODES": "1"}, "asks for 2 node(s) but its job runs on 1"),
    (8, 2, {"SUBMITIT_LOCAL_JOB_ID": "9"}, "asks for 2 node(s) but its job runs on 1"),
])
def test_a_layout_that_cannot_be_says_why(monkeypatch, processes, nodes, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        node_layout(processes, nodes)
