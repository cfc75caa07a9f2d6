"""Ring attention (contiguous or zigzag layout), forward and backward, as an autograd Function.

Forward: at step s a rank holds the K/V of rank (r - s) mod W; it posts the transfer of
that K/V to the next rank, computes the blocks the causal mask leaves (see `block_plan`),
folds them into its running (out, lse) by log-sum-exp, then waits for the next K/V.
Backward recomputes every block from the saved final LSE (no probabilities are kept) and
sends the K/V around once more; the dK/dV accumulated for the K/V a rank holds travel
with it, one step behind, and after W steps arrive back at their owner.
"""
from __future__ import annotations

import torch

from flashwatt.distributed import split_mode
from flashwatt.distributed.comm import Ring, pass_on
from flashwatt.distributed.merge import LseMerge, accumulation_dtype

ALL = slice(None)


def block_plan(layout: str, rank: int, origin: int, causal: bool, length: int) -> list[tuple[slice, slice, bool]]:
    """(query rows, key rows, diagonal-causal) blocks rank `rank` computes against the K/V of
    rank `origin`; `length` is the local sequence length.

    contiguous: rank r holds chunk r; keys of an earlier rank are all visible, of a later
    rank none. zigzag: rank r holds chunks r and 2W-1-r (halves of its part); the first
    half of an earlier rank's K/V is visible to all its rows, the second half to none; a
    later rank's K/V is visible, in full, to the second half of its rows only."""
    if not causal:
        return [(ALL, ALL, False)]
    if origin == rank:
        return [(ALL, ALL, True)]
    if layout == "contiguous":
        return [(ALL, ALL, False)] if origin < rank else []
    half = length // 2
    if origin < rank:
        return [(ALL, slice(0, half), False)]
    return [(slice(half, None), ALL, False)]


def _rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    return t if rows == ALL else t[:, :, rows]


def ring_forward(q, k, v, causal: bool, scale: float, ring: Ring, layout: str, block):
    merge = LseMerge(q)
    kv = [k, v]
    for step in range(ring.size):
        pending = pass_on(ring, kv) if step + 1 < ring.size and split_mode.communicate() else None
        if split_mode.compute():
            for rows, keys, diagonal in block_plan(layout, ring.rank, ring.origin(step), causal, q.shape[2]):
                out, lse = block.forward(_rows(q, rows), _rows(kv[0], keys), _rows(kv[1], keys), diagonal, scale)
                merge.add(out, lse, rows)
        if pending is not None:
            kv = pending.wait()
    return merge.out.to(q.dtype), merge.lse


def ring_backward(dout, q, k, v, out, lse, causal: bool, scale: float, ring: Ring, layout: str, block):
    acc = accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = [k, v]
    travelling = None  # the dK/dV posted to the next rank at the previous step
    passing = ring.size > 1 and split_mode.communicate()
    for step in range(ring.size):
        pending_kv = pass_on(ring, kv) if step + 1 < ring.size and passing else None
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        if split_mode.compute():
            for rows, keys, diagonal in block_plan(layout, ring.rank, ring.origin(step), causal, q.shape[2]):
                gq, gk, gv = block.backward(_rows(dout, rows), _rows(q, rows), _rows(kv[0], keys),
                                            _rows(kv[1], keys), _rows(out, rows), _rows(lse, rows), diagonal, scale)
                dq[:, :, rows] += gq
                dk[:, :, keys] += gk
                dv[:, :, keys] += gv
        if travelling is not None:
            # The dK/dV of the K/V held now, with the contributions of the ranks before.
            before_k, before_v = travelling.wait()
            dk += before_k
            dv += before_v
        if passing:
            travelling = pass_on(ring, [dk, dv])
        if pending_kv is not None:
            kv = pending_kv.wait()
    if passing:
        dk, dv = travelling.wait()  # one last step brings each rank its own K/V's gradients
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """Differentiable ring attention over `group` (None: a ring of one, no communication)."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, group, layout: str, block):
        ring = Ring.of(group)
        out, lse = ring_forward(q, k, v, causal, scale, ring, layout, block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.ring, ctx.layout, ctx.block = causal, scale, ring, layout, block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.ring, ctx.layout, ctx.block)
        return dq, dk, dv, None, None, None, None, None
