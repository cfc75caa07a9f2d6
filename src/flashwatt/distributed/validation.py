"""Input checks with errors that name the problem (shape, L, world size, strategy)."""
from __future__ import annotations

import torch


def check_length(L: int, world: int, strategy: str) -> None:
    if L % (2 * world):
        raise ValueError(f"strategy {strategy!r}: sequence length L={L} is not divisible by 2 x world size "
                         f"(world size {world}, so L must be a multiple of {2 * world})")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, strategy: str, world: int,
                 head_split: int = 1) -> None:
    """q (B, H, L_local, D), k/v (B, Hkv, L_local, D), H a multiple of Hkv; L = L_local x world
    divisible by 2 x world; heads (q and k/v) divisible by `head_split` (Ulysses' size)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"strategy {strategy!r}: {name} must be a 4-d tensor (B, H, L, D), "
                             f"got {getattr(t, 'shape', type(t))}")
    if k.shape != v.shape:
        raise ValueError(f"strategy {strategy!r}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    B, H, L, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or k.shape[2] != L:
        raise ValueError(f"strategy {strategy!r}: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} in batch, "
                         "local length or head_dim (self-attention: every rank holds equal q and k/v parts)")
    if k.shape[1] < 1 or H % k.shape[1]:
        raise ValueError(f"strategy {strategy!r}: q heads ({H}) must be a multiple of k/v heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError(f"strategy {strategy!r}: q, k, v must share dtype and device")
    check_length(L * world, world, strategy)
    if head_split > 1 and (H % head_split or k.shape[1] % head_split):
        raise ValueError(f"strategy {strategy!r}: the all-to-all needs q heads ({H}) and k/v heads ({k.shape[1]}) "
                         f"divisible by its {head_split} ranks (world size {world})")
