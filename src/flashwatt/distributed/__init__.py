"""Sequence-parallel attention across GPUs (or CPU processes): ring, zigzag, Ulysses, hybrid.

    q_local = shard_sequence(q, strategy="zigzag")
    out_local = attention(q_local, k_local, v_local, causal=True, strategy="zigzag")
    out = gather_sequence(out_local, strategy="zigzag")

Layout (B, H, L, D), sequence dimension 2, over torch.distributed (NCCL on GPUs, gloo on
CPU). Exact: partial results merge by log-sum-exp in float32 (float64 for float64
inputs); backward recomputes blocks from the saved LSE.

A cell's ranks are processes of their own, owned by a supervisor on each node
(rank_supervisor, rank_process, rank_fate, node_watch): a rank that fails ends them all
within the failure policy's bound (flashwatt.submit.failure_policy). parallel_tables and
parallel_reasons write docs/parallel.md from the suites' tables.
"""
import importlib

__all__ = ["attention", "shard_sequence", "gather_sequence", "STRATEGIES"]
# Loaded on first use: the workflow reads this package's cell names and config section
# while it plans, where torch is not needed.
_PUBLIC = {"attention": "api", "STRATEGIES": "groups", "gather_sequence": "layout", "shard_sequence": "layout"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"flashwatt.distributed.{_PUBLIC[name]}"), name)
    raise AttributeError(name)
