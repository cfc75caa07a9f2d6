"""Seeded inputs of a distributed cell: the whole sequence, the same on every rank."""
from __future__ import annotations

import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


def make_full(spec: dict, device, dtype):
    """q, k, v, dout of the whole sequence from N(0, 1) under spec["seed"] (drawn in float32)."""
    gen = torch.Generator(device=device).manual_seed(int(spec.get("seed", 0)))
    B, H, Hkv, L, D = (spec[k] for k in ("batch", "heads", "kv_heads", "seq_len", "head_dim"))

    def draw(heads):
        return torch.randn((B, heads, L, D), generator=gen, device=device, dtype=torch.float32).to(dtype)

    return draw(H), draw(Hkv), draw(Hkv), draw(H)
