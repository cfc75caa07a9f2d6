"""flashwatt.distributed.job on CPU: gloo ranks, float64 math blocks, the record's contents."""
from __future__ import annotations

import json

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import job_worker
from flashwatt.distributed import job as job_module
from flashwatt.distributed.job import job
from support import free_ports


@pytest.mark.slow  # a gloo process group, each rank importing torch
def test_two_rank_jobs_check_time_and_split_communication(tmp_path):
    report = tmp_path / "records.json"
    mp.spawn(job_worker.main, args=(2, free_ports(len(job_worker.SPECS)), str(report)), nprocs=2, join=True)
    zigzag, ulysses = json.loads(report.read_text())
    for rec in (zigzag, ulysses):
        assert rec["status"] == "ok", rec.get("traceback", rec)
        assert rec["world_size"] == 2
        assert rec["check"]["passed"], rec["check"]
        assert rec["environment"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                      "NVSHMEM_DISABLE_NVLS": "1"}
        assert rec["time"]["forward_ms"] > 0 and rec["tflops"]["total"] > 0
        assert rec["tflops"]["per_gpu"] == rec["tflops"]["total"] / 2
        fwd = rec["communication"]["forward"]
        assert fwd["comm_only_ms"] > 0 and len(fwd["per_rank_full_ms"]) == 2
        assert "compute only" in rec["communication"]["method"]
        assert rec["context_parallel"]["status"] == "skipped" and "CPU" in rec["context_parallel"]["reason"]
        assert rec["single_gpu"]["total_ms"] > 0 and rec["speedup"] > 0
        # No NVML on CPU ranks: each energy entry says why, and nothing else is lost.
        assert "no CUDA device" in rec["energy"]["reason"] and rec["trace"] == []
        assert rec["single_gpu"]["energy"] == {"reason": "no CUDA device"}
        assert "energy_ratio_to_one_gpu" not in rec
    assert set(zigzag["check"]["error"]) == {"out", "dq", "dk", "dv"}
    assert all(e < 1e-13 for e in zigzag["check"]["error"].values()), zigzag["check"]
    assert zigzag["time"]["backward_ms"] > 0 and "backward" in zigzag["communication"]
    assert set(ulysses["check"]["error"]) == {"out"} and ulysses["time"]["backward_ms"] is None


@pytest.mark.slow  # a gloo process group, each rank importing torch
def test_four_rank_hybrid_job_on_a_two_by_two_mesh(tmp_path):
    report = tmp_path / "records.json"
    mp.spawn(job_worker.main, args=(4, free_ports(1), str(report)), nprocs=4, join=True)
    (rec,) = json.loads(report.read_text())
    assert rec["status"] == "ok", rec.get("traceback", rec)
    assert rec["check"]["passed"] and set(rec["check"]["error"]) == {"out", "dq", "dk", "dv"}, rec["check"]
    assert all(e < 1e-13 for e in rec["check"]["error"].values())
    assert len(rec["communication"]["backward"]["per_rank_full_ms"]) == 4
    assert rec["context_parallel"]["status"] == "skipped"


def test_world_size_one_job_in_process():
    spec = dict(job_worker.SPECS[0], strategy="ring", gpus=1)
    rec = job(spec)
    assert rec["status"] == "ok" and rec["check"]["passed"], rec
    assert rec["communication"]["forward"]["comm_only_ms"] >= 0


def test_cells_that_cannot_run_are_skipped_with_the_reason():
    too_many = dict(job_worker.SPECS[0], gpus=64, precision="bf16", block="flash")
    rec = job(too_many)
    assert rec["status"] == "skipped"
    assert "GPU" in rec["reason"] or "CUDA" in rec["reason"]
    custom = dict(job_worker.SPECS[0], block="custom", precision="bf16")
    rec = job(custom)
    assert rec["status"] == "skipped" and ("GPU" in rec["reason"] or "CUDA" in rec["reason"])


def test_an_interrupted_cell_reaches_the_caller_as_the_interrupt(monkeypatch):
    # Ctrl-C (or a time limit's SIGINT) inside the cell: the job must not wait at the closing
    # barrier nor hide the interrupt behind an error of its own; the process group is released.
    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(job_module, "_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        job(dict(job_worker.SPECS[0], strategy="ring", gpus=1))
    assert not dist.is_initialized()
