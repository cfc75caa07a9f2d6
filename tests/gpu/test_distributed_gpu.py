"""Distributed attention on one GPU: the ring's schedule through the real block kernels,
and a world-size-1 job through NCCL.

The ring is simulated in one process: the sequence is cut as W ranks would hold it, and
for every simulated rank and step the blocks `block_plan` names run through the block
backend (flash, efficient, cuDNN SDPA ops; our kernels' forward and backward), their real
(out, lse) folded by `LseMerge`; backward runs every block's backward from the final
out and LSE and sums dK/dV at the K/V's owner. The result must be within twice the same
backend's error on the whole sequence in one call (the single-GPU error), against float64.
"""
from __future__ import annotations

import math

import pytest
import torch

from flashwatt.kernels.blocks import CudnnBlock, CustomBlock, EfficientBlock, FlashBlock
from flashwatt.distributed.job import job
from flashwatt.distributed.layout import local_part
from flashwatt.distributed.merge import LseMerge, accumulation_dtype
from flashwatt.distributed.reference import reference_group
from flashwatt.distributed.ring import ALL, block_plan

pytestmark = pytest.mark.gpu

BLOCKS = [  # (block, dtype, backward)
    (FlashBlock, torch.bfloat16, True),
    (FlashBlock, torch.float16, True),
    (EfficientBlock, torch.float32, True),
    (EfficientBlock, torch.bfloat16, True),
    (CudnnBlock, torch.bfloat16, True),
    (CustomBlock, torch.bfloat16, True),
    (CustomBlock, torch.float16, True),
    (CustomBlock, torch.float32, True),
]
NEEDS_NVCC = {CustomBlock}  # the custom kernels are built


def _rows(t, rows):
    return t if rows == ALL else t[:, :, rows]


def simulate_ring(block, q, k, v, dout, causal, world, layout, scale):
    """Every rank's ring schedule in one process; returns the full-sequence (out, dq, dk, dv)."""
    strategy = "zigzag" if layout == "zigzag" else "ring"
    index = torch.arange(q.shape[2], device=q.device).view(1, 1, -1, 1)
    owned = [local_part(index, strategy, {"rank": r, "world": world}).view(-1) for r in range(world)]
    part = [[None if t is None else t[:, :, owned[r]] for t in (q, k, v, dout)] for r in range(world)]
    outs, lses = [], []
    for r in range(world):
        qr = part[r][0]
        merge = LseMerge(qr)
        for step in range(world):
            origin = (r - step) % world
            kr, vr = part[origin][1], part[origin][2]
            for rows, keys, diagonal in block_plan(layout, r, origin, causal, qr.shape[2]):
                o, lse = block.forward(_rows(qr, rows), _rows(kr, keys), _rows(vr, keys), diagonal, scale)
                assert lse.shape == o.shape[:3] and lse.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
                merge.add(o, lse, rows)
        outs.append(merge.out.to(q.dtype))
        lses.append(merge.lse)
    full = torch.empty_like(q)
    for r in range(world):
        full[:, :, owned[r]] = outs[r]
    if dout is None:
        return full, None, None, None
    acc = accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros_like(dk)
    for r in range(world):
        qr, _, _, dor = part[r]
        for step in range(world):
            origin = (r - step) % world
            kr, vr = part[origin][1], part[origin][2]
            for rows, keys, diagonal in block_plan(layout, r, origin, causal, qr.shape[2]):
                gq, gk, gv = block.backward(_rows(dor, rows), _rows(qr, rows), _rows(kr, keys), _rows(vr, keys),
                                            _rows(outs[r], rows), _rows(lses[r], rows), diagonal, scale)
                dq[:, :, owned[r][rows]] += gq.to(acc)
                dk[:, :, owned[origin][keys]] += gk.to(acc)
                dv[:, :, owned[origin][keys]] += gv.to(acc)
    return full, dq, dk, dv


def _reference(q, k, v, dout, causal):
    G = q.shape[1] // k.shape[1]
    parts = [reference_group(q[0, g * G:(g + 1) * G], k[0, g], v[0, g],
                             None if dout is None else dout[0, g * G:(g + 1) * G], causal)
             for g in range(k.shape[1])]
    out = torch.cat([p[0] for p in parts])[None]
    if dout is None:
        return out, None, None, None
    return (out, torch.cat([p[1] for p in parts])[None], torch.stack([p[2] for p in parts])[None],
            torch.stack([p[3] for p in parts])[None])


def _rel(a, b) -> float:
    assert torch.isfinite(a).all()
    return float(torch.linalg.vector_norm(a.double() - b) / torch.linalg.vector_norm(b))


@pytest.mark.parametrize("block_cls,dtype,backward",
                         [pytest.param(b, d, bw, marks=[pytest.mark.nvcc] if b in NEEDS_NVCC else [],
                                       id=f"{b.name}-{str(d).split('.')[-1]}") for b, d, bw in BLOCKS])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_ring_schedule_with_real_blocks_matches_float64(block_cls, dtype, backward, causal, layout):
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    B, H, Hkv, L, D, world = 1, 8, 2, 2048, 128, 4
    q, dout = (torch.randn(B, H, L, D, generator=gen, device=dev).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, L, D, generator=gen, device=dev).to(dtype) for _ in range(2))
    dout = dout if backward else None
    scale = 1 / math.sqrt(D)
    block = block_cls()
    ref = _reference(q, k, v, dout, causal)
    ring = simulate_ring(block, q, k, v, dout, causal, world, layout, scale)
    # The same backend on the whole sequence in one call: the single-GPU error.
    out1, lse1 = block.forward(q, k, v, causal, scale)
    single = [out1]
    if backward:
        single += list(block.backward(dout, q, k, v, out1, lse1, causal, scale))
    for name, got, one, r in zip(("out", "dq", "dk", "dv"), ring, single, ref):
        err, err1 = _rel(got, r), _rel(one, r)
        assert err <= 2 * err1, f"{name}: ring error {err:.3e} above twice the single-GPU error {err1:.3e}"
        assert err1 < 3e-2, f"{name}: single-GPU error {err1:.3e} (the backend itself is off)"


def test_world_size_one_job_checks_and_times():
    spec = {"strategy": "zigzag", "gpus": 1, "batch": 1, "heads": 8, "kv_heads": 2, "seq_len": 8192,
            "head_dim": 128, "precision": "bf16", "causal": True, "pass": "fwd_bwd", "block": "flash",
            "repeats": 5, "warmup": 2}
    rec = job(spec)
    assert rec["status"] == "ok", rec.get("traceback", rec)
    assert rec["check"]["passed"], rec["check"]
    assert set(rec["check"]["error"]) == {"out", "dq", "dk", "dv"}
    assert rec["memory"]["peak_bytes_per_gpu"][0] > 0
    assert rec["time"]["forward_ms"] > 0 and rec["time"]["backward_ms"] > 0
    assert rec["tflops"]["per_gpu"] > 1.0
    assert rec["single_gpu"]["total_ms"] > 0
    assert rec["context_parallel"]["status"] == "ok" and rec["context_parallel"]["sdpa_backend"] == "flash_attention"
    # The job's energy window (one GPU here) and the single-GPU window, both from real NVML.
    energy = rec["energy"]
    assert energy["n_gpus"] == 1 and energy["edges_aligned"] and energy["energy_per_call_j"] > 0, energy
    assert energy["avg_power_w"] > energy["idle_power_w"] and energy["j_per_token"] > 0
    assert rec["single_gpu"]["energy"]["n_gpus"] == 1 and 0.8 < rec["energy_ratio_to_one_gpu"] < 1.25
    assert rec["trace"] and {row["gpu"] for row in rec["trace"]} == {0}
    print({k: rec[k] for k in ("time", "tflops", "speedup", "memory", "context_parallel")})


def test_cell_asking_for_more_gpus_than_exist_is_skipped():
    n = torch.cuda.device_count()
    spec = {"strategy": "ring", "gpus": n + 1, "batch": 1, "heads": 2, "kv_heads": 2, "seq_len": 1024,
            "head_dim": 64, "precision": "bf16", "causal": True, "pass": "fwd", "block": "flash"}
    rec = job(spec)
    assert rec["status"] == "skipped" and f"asks for {n + 1} GPUs" in rec["reason"]
