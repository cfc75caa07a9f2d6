"""Which part of the sequence each rank holds, and the moves between full and sharded.

ring and ulysses: rank r holds contiguous chunk r of W. zigzag: the sequence is cut
into 2W chunks and rank r holds chunks r and 2W-1-r (so causal work is balanced).
hybrid on an R x U mesh (R ring ranks across nodes, U Ulysses ranks inside one): the
zigzag over R gives ring rank i its chunks i and 2R-1-i; that part is then cut into U
contiguous pieces, one per Ulysses rank (the all-to-all reassembles it in that order).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from flashwatt.distributed.groups import resolve
from flashwatt.distributed.validation import check_length

SEQ_DIM = 2


def _zigzag_part(x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    chunks = x.chunk(2 * size, dim=SEQ_DIM)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=SEQ_DIM)


def local_part(x: torch.Tensor, strategy: str, coords: dict) -> torch.Tensor:
    """This rank's part of a full-sequence tensor, given its coordinates from `resolve`."""
    if strategy in ("ring", "ulysses"):
        return x.chunk(coords["world"], dim=SEQ_DIM)[coords["rank"]]
    if strategy == "zigzag":
        return _zigzag_part(x, coords["rank"], coords["world"])
    # hybrid
    part = _zigzag_part(x, coords["ring_rank"], coords["ring_size"])
    return part.chunk(coords["ulysses_size"], dim=SEQ_DIM)[coords["ulysses_rank"]]


def shard_sequence(x: torch.Tensor, strategy: str = "ring", group=None) -> torch.Tensor:
    """This rank's part (a contiguous copy) of x (B, H, L, D), the full sequence on every rank."""
    coords = resolve(strategy, group)
    check_length(x.shape[SEQ_DIM], coords["world"], strategy)
    return local_part(x, strategy, coords).contiguous()


def gather_sequence(x_local: torch.Tensor, strategy: str = "ring", group=None) -> torch.Tensor:
    """The full sequence from every rank's part (an all-gather; not differentiable)."""
    coords = resolve(strategy, group)
    world = coords["world"]
    parts = [torch.empty_like(x_local) for _ in range(world)]
    dist.all_gather(parts, x_local.contiguous(), group=coords["world_group"])
    L = x_local.shape[SEQ_DIM] * world
    # Rebuild through the index map: position of every global row in the gathered rows.
    index = torch.arange(L).view(1, 1, L, 1)
    owner = torch.cat([local_part(index, strategy, coords_of(coords, r)) for r in range(world)], dim=SEQ_DIM)
    stacked = torch.cat(parts, dim=SEQ_DIM)
    full = torch.empty_like(stacked)
    full[:, :, owner.view(-1).to(stacked.device)] = stacked
    return full


def coords_of(coords: dict, group_rank: int) -> dict:
    """The coordinates rank `group_rank` of the same layout has (ranks in group order)."""
    out = dict(coords, rank=group_rank)
    if "positions" in coords:  # hybrid: the world group's ranks are global ranks
        out["ring_rank"], out["ulysses_rank"] = coords["positions"][group_rank]
    return out
