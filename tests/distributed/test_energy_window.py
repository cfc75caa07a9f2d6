"""The job-wide energy window (flashwatt.distributed.energy_window) on CPU: gloo ranks in
lockstep over fake GPUs, on one host (rank 0 reads every GPU) and on two (each host's first
rank reads its own, the sum at rank 0)."""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

import energy_worker
from flashwatt.distributed.energy_window import MULTI_HOST_FLAG
from support import free_ports

pytestmark = pytest.mark.slow  # a gloo process group per test, each rank importing torch


def _run(tmp_path, hosts, with_gpus=True, broken_nvml=False):
    report = tmp_path / "energy.json"
    mp.spawn(energy_worker.main, args=(len(hosts), free_ports()[0], str(report), hosts, with_gpus, broken_nvml),
             nprocs=len(hosts), join=True)
    return json.loads(report.read_text())


def _sums_hold(energy, gpus):
    assert energy["n_gpus"] == gpus and len(energy["per_gpu"]) == gpus
    assert energy["energy_j"] == pytest.approx(sum(g["energy_j"] for g in energy["per_gpu"]))
    # Every fake GPU drew 400 W through the window.
    assert 0.85 * 400 * gpus < energy["avg_power_w"] < 1.15 * 400 * gpus, energy["avg_power_w"]
    assert energy["energy_per_call_j"] == pytest.approx(energy["energy_j"] / energy["calls"], rel=0.02)


def test_one_host_rank_zero_reads_every_gpu_and_every_rank_runs_its_steps(tmp_path):
    out = _run(tmp_path, ["node-a"] * 3)
    energy = out["energy"]
    assert len(set(out["counts"])) == 1 and out["counts"][0] >= 10, out["counts"]
    assert out["opened"] == [[out["uuids"]], [], []]  # rank 0, every GPU of the job
    assert energy["sync_calls"] <= out["counts"][0] and energy["edges_aligned"]
    _sums_hold(energy, 3)
    assert out["trace_gpus"] == [0, 1, 2]


def test_several_hosts_each_read_their_own_gpus_over_the_same_steps(tmp_path):
    out = _run(tmp_path, ["node-a", "node-a", "node-b", "node-b"])
    energy, uuids = out["energy"], out["uuids"]
    # The first rank of each host opened that host's GPUs, nobody else any.
    assert out["opened"] == [[uuids[:2]], [], [uuids[2:]], []]
    # A fixed count, from the step time: 0.3 s / 2 ms.
    assert out["counts"] == [150] * 4 and energy["sync_calls"] == 150
    assert energy["hosts"] == ["node-a", "node-b"] and MULTI_HOST_FLAG in energy["flags"]
    assert [g["host"] for g in energy["per_gpu"]] == ["node-a", "node-a", "node-b", "node-b"]
    assert [g["gpu"] for g in energy["per_gpu"]] == [0, 1, 2, 3] and out["trace_gpus"] == [0, 1, 2, 3]
    _sums_hold(energy, 4)


def test_ranks_without_a_gpu_give_the_reason_and_no_window(tmp_path):
    out = _run(tmp_path, ["node-a", "node-b"], with_gpus=False)
    assert out["energy"] == {"reason": "no CUDA device: energy is measured on NVIDIA GPUs only"}
    assert out["counts"] == [0, 0] and out["opened"] == [[], []]


def test_nvml_failing_on_rank_zero_gives_a_reason_and_releases_the_other_ranks(tmp_path):
    out = _run(tmp_path, ["node-a"] * 2, broken_nvml=True)
    assert out["energy"] == {"reason": "energy window failed: RuntimeError: NVML gone"}
    assert out["counts"] == [0, 0]  # nobody ran a step, nobody was left waiting for one
