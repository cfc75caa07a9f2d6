"""Distributed attention on every GPU of the machine, one process per GPU over NCCL: each
strategy and block backend through the cell job, its output and gradients checked against
float64, its timing, memory and the energy summed over every GPU's own window.

Needs at least two GPUs (on fewer it fails, saying so: tests/gpu/conftest.py). The hybrid
strategy runs where the machine has four or more (Ulysses pairs inside, a ring across).
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

import multi_gpu_worker
from support import free_ports

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]

WORLD = torch.cuda.device_count()
ENERGY = {"energy_window_s": 1.0, "idle_settle_s": 0.5, "idle_window_s": 1.0}


def spec(strategy, block, precision, causal, **over):
    base = {"strategy": strategy, "gpus": WORLD, "batch": 1, "heads": 8, "kv_heads": 2, "seq_len": 8192,
            "head_dim": 128, "precision": precision, "causal": causal, "pass": "fwd_bwd", "block": block,
            "repeats": 5, "warmup": 2, "measure": ENERGY}
    return {**base, **over}


SPECS = [
    spec("zigzag", "flash", "bf16", True),
    spec("ring", "cudnn", "bf16", False),
    spec("ulysses", "efficient", "fp32", True),
    spec("zigzag", "custom", "bf16", True, head_dim=64),
    spec("ring", "flash", "fp16", True, kv_heads=1, pass_="fwd"),  # MQA, forward only
]
if WORLD >= 4:
    SPECS.append(spec("hybrid", "flash", "bf16", True, ulysses_size=2))
for s in SPECS:  # `pass` is a keyword: the override above is spelt pass_
    if "pass_" in s:
        s["pass"] = s.pop("pass_")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    report = tmp_path_factory.mktemp("multi_gpu") / "records.json"
    mp.spawn(multi_gpu_worker.main, args=(WORLD, free_ports(len(SPECS)), SPECS, str(report)), nprocs=WORLD, join=True)
    return json.loads(report.read_text())


@pytest.mark.parametrize("index", range(len(SPECS)), ids=[f"{s['strategy']}-{s['block']}-{s['precision']}"
                                                          for s in SPECS])
def test_every_strategy_on_every_gpu_matches_float64_and_is_measured(records, index):
    rec, s = records[index], SPECS[index]
    assert rec["status"] == "ok", rec.get("traceback", rec)
    assert rec["world_size"] == WORLD and rec["device"].startswith("NVIDIA")
    check = rec["check"]
    assert check["passed"], check
    assert set(check["error"]) == ({"out", "dq", "dk", "dv"} if s["pass"] == "fwd_bwd" else {"out"})
    assert len(rec["memory"]["peak_bytes_per_gpu"]) == WORLD
    assert rec["time"]["total_ms"] > 0 and rec["speedup"] > 0 and rec["single_gpu"]["total_ms"] > 0
    assert rec["environment"]["NCCL_NVLS_ENABLE"] == "0"
    energy = rec["energy"]
    assert energy.get("n_gpus") == WORLD, energy
    assert len(energy["per_gpu"]) == WORLD and all(g["energy_j"] > 0 for g in energy["per_gpu"])
    assert energy["energy_j"] == pytest.approx(sum(g["energy_j"] for g in energy["per_gpu"]))
    # Every GPU of the job drew power above idle through the window.
    assert all(g["avg_power_w"] > g["idle_power_w"] for g in energy["per_gpu"]), energy["per_gpu"]
    assert rec["single_gpu"]["energy"]["n_gpus"] == 1 and rec["energy_ratio_to_one_gpu"] > 0
    assert len(rec["trace"]) > 0
    peer = rec["context_parallel"]
    if s["block"] in ("flash", "cudnn"):  # PyTorch's context_parallel runs these: it must, in the same run
        assert peer["status"] == "ok", peer
        assert peer["sdpa_backend"] == f"{s['block']}_attention" and peer["total_ms"] > 0
    else:
        assert peer["status"] == "ok" or peer["reason"], peer
    print(s["strategy"], s["block"], s["precision"], {k: rec[k] for k in ("speedup", "efficiency")},
          rec["time"], {k: energy[k] for k in ("energy_per_call_j", "avg_power_w", "flags")},
          rec["energy_ratio_to_one_gpu"], rec["context_parallel"].get("total_ms"))
