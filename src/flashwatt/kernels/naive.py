"""The seeds' baseline: matmul, softmax, matmul in plain PyTorch, the L×L scores materialised."""
from __future__ import annotations

import math

import torch

from flashwatt.attention.cell import Cell


class Naive:
    name = "naive"
    differentiable = True

    def supports(self, cell: Cell, device: torch.device) -> str | None:
        if device.type == "cpu" and cell.precision != "fp32":
            # tf32 exists only on CUDA tensor cores, and CPU half-precision matmuls measure
            # an emulation path nobody deploys.
            return f"naive on CPU runs fp32 only (cell asks for {cell.precision})"
        return None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cell: Cell) -> torch.Tensor:
        if k.shape[1] != q.shape[1]:  # grouped-query attention, materialised like the scores
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if cell.causal:
            L = q.shape[-2]
            mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu_(1)
            scores = scores.masked_fill(mask, float("-inf"))
        # softmax in the storage dtype, as the seeds' baseline did
        return torch.matmul(torch.softmax(scores, dim=-1), v)
