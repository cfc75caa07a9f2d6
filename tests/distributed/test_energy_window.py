"""The job-wide energy window (flashwatt.distributed.energy_window) on CPU: gloo ranks in
lockstep with rank 0's window over fake GPUs, and the refusal of a job over several hosts."""
from __future__ import annotations

import json
import socket

import torch.multiprocessing as mp

import energy_worker


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, hosts):
    report = tmp_path / "energy.json"
    mp.spawn(energy_worker.main, args=(len(hosts), _port(), str(report), hosts), nprocs=len(hosts), join=True)
    return json.loads(report.read_text())


def test_every_rank_runs_rank_zeros_steps_and_the_energy_is_summed_over_the_gpus(tmp_path):
    out = _run(tmp_path, ["node-a", "node-a", "node-a"])
    window = out["window"]
    assert len(set(out["counts"])) == 1 and out["counts"][0] >= 10, out["counts"]
    # Every step of the window (and of the end-edge batches) ran on every rank.
    assert window["sync_calls"] <= out["counts"][0]
    assert window["n_gpus"] == 3 and len(window["per_gpu"]) == 3
    assert abs(window["energy_j"] - sum(g["energy_j"] for g in window["per_gpu"])) < 1e-9
    # Three fake GPUs at 400 W over the window.
    assert 0.85 * 1200 < window["avg_power_w"] < 1.15 * 1200, window["avg_power_w"]
    # One host, CPU tensors: no NVML reading, and that is why.
    assert "no CUDA device" in out["refused"]


def test_a_job_over_several_hosts_is_refused_naming_them(tmp_path):
    out = _run(tmp_path, ["node-a", "node-b"])
    assert "2 hosts (node-a, node-b)" in out["refused"]
