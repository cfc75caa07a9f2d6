"""The seeds' baseline: matmul, softmax, matmul in plain PyTorch, the L×L scores materialised.

What it runs (every precision on CUDA, fp32 on the CPU) is declared in flashwatt.kernels.registry.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flashwatt.kernels.call import AttentionCall


class Naive:
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: "AttentionCall") -> torch.Tensor:
        if k.shape[1] != q.shape[1]:  # grouped-query attention, materialised like the scores
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if call.causal:
            L = q.shape[-2]
            mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu_(1)
            scores = scores.masked_fill(mask, float("-inf"))
        # softmax in the storage dtype, as the seeds' baseline did
        return torch.matmul(torch.softmax(scores, dim=-1), v)
