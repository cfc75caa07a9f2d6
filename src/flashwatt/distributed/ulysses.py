"""Ulysses all-to-all: sequence-sharded (B, H, L/W, D) <-> head-sharded (B, H/W, L, D).

Rank r sends head group j of its sequence part to rank j and receives, from every rank,
its own head group's part of their sequence, concatenated in rank order (the contiguous
layout). Each move is the other's gradient.
"""
from __future__ import annotations

import torch

from flashwatt.distributed import split_mode
from flashwatt.distributed.comm import all_to_all


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    return all_to_all(x, group) if split_mode.communicate() else x.contiguous()


def seq_to_head(x: torch.Tensor, group, world: int) -> torch.Tensor:
    B, H, L, D = x.shape
    send = x.reshape(B, world, H // world, L, D).permute(1, 0, 2, 3, 4)
    got = _exchange(send.contiguous(), group)  # (source rank = sequence part, B, H/W, L/W, D)
    return got.permute(1, 2, 0, 3, 4).reshape(B, H // world, world * L, D)


def head_to_seq(x: torch.Tensor, group, world: int) -> torch.Tensor:
    B, H, L, D = x.shape
    send = x.reshape(B, H, world, L // world, D).permute(2, 0, 1, 3, 4)
    got = _exchange(send.contiguous(), group)  # (source rank = head group, B, H, L/W, D)
    return got.permute(1, 0, 2, 3, 4).reshape(B, world * H, L // world, D)


class SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world: int):
        ctx.group, ctx.world = group, world
        return seq_to_head(x, group, world)

    @staticmethod
    def backward(ctx, grad):
        return head_to_seq(grad, ctx.group, ctx.world), None, None


class HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world: int):
        ctx.group, ctx.world = group, world
        return head_to_seq(x, group, world)

    @staticmethod
    def backward(ctx, grad):
        return seq_to_head(grad, ctx.group, ctx.world), None, None
