"""`attention`: sequence-parallel attention over the ranks of a group, one strategy at a time."""
from __future__ import annotations

import math

import torch

from flashwatt.distributed.blocks import get_block
from flashwatt.distributed.groups import resolve
from flashwatt.distributed.ring import RingAttention
from flashwatt.distributed.ulysses import HeadToSeq, SeqToHead
from flashwatt.distributed.validation import check_inputs


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, strategy: str = "ring",
              block="auto", group=None, scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's query part against the whole sequence; differentiable.

    q (B, H, L/W, D), k/v (B, Hkv, L/W, D): this rank's parts as `shard_sequence` cuts them
    for the same strategy and group. block: 'auto', 'math' (float64), 'flash', 'efficient',
    'cudnn', 'custom' (our CUDA kernels), or an object with forward/backward/differentiable.
    group: a process group (ring, zigzag, ulysses; None = world) or a 2-D DeviceMesh
    (hybrid: dim 0 ring across nodes, dim 1 Ulysses inside a node; None = default).
    """
    coords = resolve(strategy, group)
    blk = get_block(block, q)
    if not getattr(blk, "differentiable", False) and torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v)):
        raise NotImplementedError(
            f"block {getattr(blk, 'name', blk)!r} is forward-only (no backward pass yet); run it under "
            "torch.no_grad() or pick block 'flash', 'efficient', 'cudnn' or 'custom'")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    world = coords["world"]
    if strategy in ("ring", "zigzag"):
        check_inputs(q, k, v, strategy, world)
        layout = "zigzag" if strategy == "zigzag" else "contiguous"
        group_arg = coords["group"] if world > 1 else None
        return RingAttention.apply(q, k, v, causal, scale, group_arg, layout, blk)
    if strategy == "ulysses":
        check_inputs(q, k, v, strategy, world, head_split=world)
        g = coords["group"]
        qh, kh, vh = (SeqToHead.apply(t, g, world) for t in (q, k, v))
        out = RingAttention.apply(qh, kh, vh, causal, scale, None, "contiguous", blk)
        return HeadToSeq.apply(out, g, world)
    # hybrid: Ulysses inside the node turns the node's sequence part into full heads of
    # the ring part; the ring (zigzag) across nodes then covers the whole sequence.
    U, R = coords["ulysses_size"], coords["ring_size"]
    check_inputs(q, k, v, strategy, world, head_split=U)
    ug = coords["ulysses_group"]
    qh, kh, vh = (SeqToHead.apply(t, ug, U) for t in (q, k, v))
    out = RingAttention.apply(qh, kh, vh, causal, scale, coords["ring_group"] if R > 1 else None, "zigzag", blk)
    return HeadToSeq.apply(out, ug, U)
