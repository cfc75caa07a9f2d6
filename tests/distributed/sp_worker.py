"""Work run inside each spawned gloo process of the CPU sequence-parallel tests.

Every rank builds the same seeded full-sequence inputs, shards them, runs distributed
attention forward and backward with float64 math blocks, gathers the results and
compares them with a single-process float64 reference. Rank 0 writes a JSON report:
the largest relative error of every case, and the message of every bad-input error.
"""
from __future__ import annotations

import json
import math
import os
import traceback

import torch
import torch.distributed as dist

# Never let NVLink multicast be touched by anything started from here (GPU hosts).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def reference(q, k, v, causal: bool, dout):
    """float64 attention on one process (K/V heads expanded for GQA) and its gradients."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ ke.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[2]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ ve
    grads = torch.autograd.grad(out, (q, k, v), dout.double())
    return out.detach(), grads


def rel(a, b) -> float:
    return float(torch.linalg.vector_norm(a.double() - b) / torch.linalg.vector_norm(b))


def run_case(strategy, causal, B, H, Hkv, L, D, group=None, seed=0) -> float:
    from flashwatt.distributed import attention, gather_sequence, shard_sequence

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, L, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, L, D, generator=gen, dtype=torch.float64)
    dout = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    ref_out, ref_grads = reference(q, k, v, causal, dout)
    parts = [shard_sequence(t, strategy, group).requires_grad_(True) for t in (q, k, v)]
    out = attention(*parts, causal=causal, strategy=strategy, block="math", group=group)
    out.backward(shard_sequence(dout, strategy, group))
    errors = [rel(gather_sequence(out.detach(), strategy, group), ref_out)]
    errors += [rel(gather_sequence(p.grad, strategy, group), g) for p, g in zip(parts, ref_grads)]
    # The layout round trip must give back the input exactly.
    assert torch.equal(gather_sequence(shard_sequence(q, strategy, group), strategy, group), q)
    return max(errors)


def expect_error(fn, *fragments) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError, RuntimeError) as err:
        text = str(err)
        missing = [f for f in fragments if f not in text]
        return f"MISSING {missing}: {text}" if missing else text
    return "NO ERROR RAISED"


def bad_inputs(world: int) -> dict:
    from flashwatt.distributed import attention, shard_sequence

    L_bad = 2 * world * 3 + world  # divisible by the world size but not by 2 x world size
    x = torch.randn(1, 2, L_bad, 8, dtype=torch.float64)
    local = torch.randn(1, 2, 3, 8, dtype=torch.float64)  # odd local length: L = 3 x world
    heads_bad = torch.randn(1, world + 1, 4, 8, dtype=torch.float64)
    ok = torch.randn(1, 2 * world, 4, 8, dtype=torch.float64)

    class ForwardOnly:
        name, differentiable = "fwd_only", False

        def forward(self, *a):
            raise AssertionError("must not run")

    return {
        "shard_length": expect_error(lambda: shard_sequence(x, "zigzag"), f"L={L_bad}", f"world size {world}",
                                     "'zigzag'"),
        "attention_length": expect_error(lambda: attention(local, local, local, strategy="ring", block="math"),
                                         f"L={3 * world}", f"world size {world}", "'ring'"),
        "ulysses_heads": expect_error(lambda: attention(heads_bad, heads_bad, heads_bad, strategy="ulysses",
                                                        block="math"), f"q heads ({world + 1})", f"world size {world}"),
        # 2W - 1 heads never divide 2W (coprime, and above 1 for W >= 2).
        "gqa_heads": expect_error(lambda: attention(ok, ok[:, :2 * world - 1], ok[:, :2 * world - 1],
                                                    strategy="ring", block="math"),
                                  f"q heads ({2 * world})", f"k/v heads ({2 * world - 1})"),
        "strategy": expect_error(lambda: attention(ok, ok, ok, strategy="stripe", block="math"), "'stripe'",
                                 "ring, zigzag, ulysses, hybrid"),
        "block_on_cpu": expect_error(lambda: attention(ok, ok, ok, strategy="ring", block="flash"),
                                     "'flash'", "CUDA"),
        "forward_only_backward": expect_error(
            lambda: attention(ok.clone().requires_grad_(True), ok, ok, strategy="ring", block=ForwardOnly()),
            "forward-only"),
        "hybrid_group": expect_error(lambda: attention(ok, ok, ok, strategy="hybrid", block="math",
                                                       group=dist.group.WORLD), "2-D DeviceMesh"),
    }


def cases(world: int) -> list[tuple]:
    """(name, strategy, causal, B, H, Hkv, L, D, mesh) for this world size."""
    L = 2 * world * 3  # three rows per zigzag chunk
    out = []
    for causal in (True, False):
        for strategy in ("ring", "zigzag"):
            out.append((f"{strategy}-gqa-causal={causal}", strategy, causal, 2, 2 * world, world, L, 8, None))
            out.append((f"{strategy}-mqa-causal={causal}", strategy, causal, 1, 3, 1, L, 4, None))
        out.append((f"ulysses-gqa-causal={causal}", "ulysses", causal, 2, 2 * world, world, L, 8, None))
        out.append((f"ulysses-mha-causal={causal}", "ulysses", causal, 1, world, world, L, 4, None))
        if world == 4:
            out.append((f"hybrid-2x2-gqa-causal={causal}", "hybrid", causal, 2, 4, 2, 2 * L, 8, (2, 2)))
            out.append((f"hybrid-default-mha-causal={causal}", "hybrid", causal, 1, 2, 2, L, 4, "default"))
    return out


def main(rank: int, world: int, port: int, report: str) -> None:
    os.environ.update(MULTICAST_OFF)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict = {"errors": {}, "bad_inputs": {}, "failures": {}}
    try:
        for name, strategy, causal, B, H, Hkv, L, D, mesh in cases(world):
            group = None
            if isinstance(mesh, tuple):
                from torch.distributed.device_mesh import init_device_mesh

                group = init_device_mesh("cpu", mesh, mesh_dim_names=("ring", "ulysses"))
            try:
                results["errors"][name] = run_case(strategy, causal, B, H, Hkv, L, D, group)
            except Exception:  # reported per case so one failure does not hide the others
                results["failures"][name] = traceback.format_exc()
        results["bad_inputs"] = bad_inputs(world)
    finally:
        if rank == 0:
            with open(report, "w") as fh:
                json.dump(results, fh, indent=1)
        dist.destroy_process_group()
