"""Float64 attention and its gradients for one K/V head group, in row chunks.

The full L x L probabilities never exist: a first pass over query-row chunks gives
every row's LSE and output, a second recomputes each chunk's probabilities from them
and accumulates dQ (per chunk), dK and dV (over all chunks). Memory is O(chunk x L), so
the gathered sequence of a long-context cell is checked on every row, exactly.
"""
from __future__ import annotations

import math

import torch


def _scores(q_rows, k, rows: slice, causal: bool, scale: float):
    s = (q_rows @ k.transpose(-2, -1)) * scale  # (G, c, L)
    if causal:
        keys = torch.arange(k.shape[-2], device=k.device)
        pos = torch.arange(rows.start, rows.stop, device=k.device)
        s = s.masked_fill(keys[None, :] > pos[:, None], float("-inf"))
    return s


def reference_group(q, k, v, dout, causal: bool, scale: float | None = None, budget_bytes: float = 2**30):
    """q, dout (G, L, D): the query heads that read K/V head k, v (L, D). Returns float64
    (out, dq, dk, dv) in the same shapes. dout None: forward only (dq, dk, dv None)."""
    q, k, v = q.double(), k.double(), v.double()
    G, L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    chunk = max(1, min(L, int(budget_bytes // (8 * G * L * 3))))
    out = torch.empty_like(q)
    lse = torch.empty((G, L), dtype=torch.float64, device=q.device)
    for start in range(0, L, chunk):
        rows = slice(start, min(L, start + chunk))
        s = _scores(q[:, rows], k, rows, causal, scale)
        lse[:, rows] = torch.logsumexp(s, dim=-1)
        out[:, rows] = torch.exp(s - lse[:, rows, None]) @ v
    if dout is None:
        return out, None, None, None
    dout = dout.double()
    delta = (dout * out).sum(-1)
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for start in range(0, L, chunk):
        rows = slice(start, min(L, start + chunk))
        p = torch.exp(_scores(q[:, rows], k, rows, causal, scale) - lse[:, rows, None])
        do = dout[:, rows]
        dv += (p.transpose(-2, -1) @ do).sum(0)
        ds = p * (do @ v.transpose(-2, -1) - delta[:, rows, None])
        dq[:, rows] = (ds @ k) * scale
        dk += (ds.transpose(-2, -1) @ q[:, rows]).sum(0) * scale
    return out, dq, dk, dv
