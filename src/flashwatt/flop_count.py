"""FLOPs of one attention call, by flash-attention's convention: 4·B·H·L²·D for the forward's
two matmuls (QKᵀ and PV), halved under a causal mask (half the score matrix is computed),
and the backward at 2.5x the forward, so forward and backward together count 3.5x.

Torch-free and the one place the convention is written: attention cells
(flashwatt.attention.cell) and distributed cells (flashwatt.distributed.job) both count
with it. Model cells count whole steps their own way (flashwatt.models.flops).
"""
from __future__ import annotations

PASS_FACTOR = {"fwd": 1.0, "fwd_bwd": 3.5}  # the pass's FLOPs over the forward's


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, pass_: str = "fwd") -> float:
    """FLOPs of one call of `pass_` on B x H x L x D queries, keys and values (L keys per query)."""
    if pass_ not in PASS_FACTOR:
        raise ValueError(f"pass {pass_!r}: allowed {', '.join(PASS_FACTOR)}")
    forward = 4.0 * batch * heads * seq_len * seq_len * head_dim
    forward = forward / 2 if causal else forward
    return forward * PASS_FACTOR[pass_]
