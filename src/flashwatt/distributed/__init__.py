"""Sequence-parallel attention across GPUs (or CPU processes): ring, zigzag, Ulysses, hybrid.

    q_local = shard_sequence(q, strategy="zigzag")
    out_local = attention(q_local, k_local, v_local, causal=True, strategy="zigzag")
    out = gather_sequence(out_local, strategy="zigzag")

Layout (B, H, L, D), sequence dimension 2, over torch.distributed (NCCL on GPUs, gloo on
CPU). Exact: partial results merge by log-sum-exp in float32 (float64 for float64
inputs); backward recomputes blocks from the saved LSE.
"""
from flashwatt.distributed.api import attention
from flashwatt.distributed.groups import STRATEGIES
from flashwatt.distributed.layout import gather_sequence, shard_sequence
from flashwatt.distributed.split_mode import split_mode

__all__ = ["attention", "shard_sequence", "gather_sequence", "split_mode", "STRATEGIES"]
