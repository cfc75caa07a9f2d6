"""Context-parallel attention as a transformers attention function: each rank's local
q, k, v go to `flashwatt.distributed.attention`, which attends them to the whole sequence
over the ranks (ring, zigzag, Ulysses, hybrid).

It is registered through transformers' attention interface with its mask function, as
flashwatt.models.attention registers the one-GPU backends: the mask function gives no
mask for unpadded causal sequences (the strategy applies the causal mask to *global*
positions, which a mask built from the local sequence could not), and a padded batch
is refused. K/V go with their own head count (GQA): the ring passes them as they are;
an all-to-all (ulysses, hybrid) needs the K/V heads divisible by its ranks, and where
they are not, each K/V head is repeated the fewest times that makes them so (the query
heads of a group still read the same K/V), and `kv_expanded` says so.

The model's attention backend names the block each rank computes with, as the backend
registry declares it (flashwatt.kernels.registry): sdpa_default `auto` (flash for
fp16/bf16 and efficient for fp32 on a GPU, float64 math on CPU), sdpa_math, sdpa_flash,
sdpa_efficient, sdpa_cudnn the SDPA op of that name, custom flashwatt's CUDA kernels.
transformers' eager attention has no sequence-parallel form.
"""
from __future__ import annotations

import math

from flashwatt.kernels import registry
from flashwatt.kernels.base import UnsupportedCell

# Each model backend with a distributed block, and its block (flashwatt.kernels.registry).
BLOCK_OF_BACKEND = {name: registry.block_of(name) for name in registry.model_backend_names()
                    if registry.block_of(name) is not None}


def block_of(backend: str) -> str | None:
    """The distributed block a model backend computes with under context parallelism
    (None: the backend has none)."""
    return BLOCK_OF_BACKEND.get(backend)


class ContextParallelAttention:
    """flashwatt.distributed.attention for one strategy and group, as a transformers
    attention function."""

    def __init__(self, strategy: str, group, block: str, ulysses_ranks: int):
        self.strategy = strategy
        self.group = group
        self.block = block
        self.ulysses_ranks = ulysses_ranks
        self.kv_expanded = False
        self.block_name: str | None = None  # the block `auto` resolved to, after the first call

    def __call__(self, module, query, key, value, attention_mask, scaling: float | None = None, dropout: float = 0.0,
                 is_causal: bool | None = None, **kwargs):
        from flashwatt.distributed.api import attention
        from flashwatt.distributed.blocks import get_block

        name = f"context-parallel attention ({self.strategy})"
        if attention_mask is not None:
            raise UnsupportedCell(f"{name} takes unpadded sequences only (the model passed an attention mask)")
        if dropout and module.training:
            raise UnsupportedCell(f"{name} has no attention dropout (the model asks for p={dropout})")
        if key.shape[2] != query.shape[2]:
            raise UnsupportedCell(f"{name} runs self-attention over the whole context only (no KV cache)")
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        split = self.ulysses_ranks
        if split > 1 and key.shape[1] % split:
            repeat = split // math.gcd(key.shape[1], split)
            key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
            self.kv_expanded = True
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        if self.block_name is None:
            self.block_name = getattr(get_block(self.block, query), "name", str(self.block))
        out = attention(query, key, value, causal=causal, strategy=self.strategy, block=self.block,
                        group=self.group, scale=scaling)
        return out.transpose(1, 2), None


def registered_name(strategy: str) -> str:
    return f"fw_cp_{strategy}"  # no "flash" in it: flashwatt.models.attention.registered_name says why


def use_context_parallel(model, strategy: str, group, block: str) -> ContextParallelAttention:
    """Switch `model` to context-parallel attention over `group`; returns the function."""
    import torch.distributed as dist

    from flashwatt.models.attention import register, unpadded_mask
    from flashwatt.models.parallel_layout import ulysses_size

    function = ContextParallelAttention(strategy, group, block, ulysses_size(strategy, dist.get_world_size()))
    model.set_attn_implementation(register(registered_name(strategy), function, unpadded_mask()))
    return function

