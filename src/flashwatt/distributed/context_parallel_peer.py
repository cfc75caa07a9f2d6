"""PyTorch's context_parallel (prototype: ring under SDPA, allgather or alltoall rotation,
head-tail load balancing for causal) timed on the same cell, as the peer of our strategies."""
from __future__ import annotations

import torch
import torch.distributed as dist

from flashwatt.distributed.inputs import make_full
from flashwatt.distributed.timing import gather, median_ms


# The SDPA backend the peer is held to: the one our block runs, so that the comparison is
# of the two schedules, not of two attention kernels. Other blocks leave SDPA its choice.
PEER_BACKEND = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def context_parallel_peer(spec, device, dtype, bwd, causal, repeats, warmup, block_name: str | None = None) -> dict:
    """The cell through context_parallel; a skipped entry with the reason where it cannot run."""
    if device.type != "cuda":
        return {"status": "skipped", "reason": "context_parallel runs only the CUDA SDPA backends (device is CPU)"}
    if spec["strategy"] == "hybrid":
        return {"status": "skipped", "reason": "context_parallel has no Ulysses x ring hybrid"}
    try:
        import contextlib

        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

        rotate = "alltoall" if spec["strategy"] == "ulysses" else "allgather"
        set_rotate_method(rotate)
        # Head-tail load balancing is context_parallel's causal mode (it refuses it for full masks).
        _cp_options.enable_load_balance = bool(causal)
        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
        q, k, v, dout = make_full(spec, device, dtype)
        G = spec["heads"] // spec["kv_heads"]
        # GQA through the LSE-returning aten ops has crashed under context_parallel: expand locally.
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        backend = PEER_BACKEND.get(block_name or "")
        pinned = sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext()
        with pinned, context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
            # The buffers are sharded in place and resized back on exit, which a tensor that
            # requires grad refuses: the leaves are detached views of this rank's shard.
            ql, kl, vl = (t.detach().requires_grad_(bwd) for t in (q, k, v))

            def fwd(_=None):
                with torch.set_grad_enabled(bwd):
                    return F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)

            def bwd_call(out):
                torch.autograd.backward(out, dout)

            f_ms = max(gather(median_ms(fwd, device, repeats, warmup)))
            b_ms = max(gather(median_ms(bwd_call, device, repeats, warmup, before=fwd))) if bwd else 0.0
        return {"status": "ok", "rotate_method": rotate, "load_balance": bool(causal),
                "sdpa_backend": backend.lower() if backend else "sdpa default", "forward_ms": f_ms,
                "backward_ms": b_ms if bwd else None, "total_ms": f_ms + b_ms}
    except Exception as err:
        return {"status": "skipped", "reason": f"context_parallel failed: {type(err).__name__}: {err}"}

