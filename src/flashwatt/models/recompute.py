"""Activation recompute on a share of a model's decoder blocks.

A share is a whole percent of the blocks, 0-100. Each block `recomputed_blocks` names
keeps only its input in the forward and reruns its forward in the backward (transformers
checkpoints a block, non-reentrant, whose `gradient_checkpointing` flag is set); every
other block keeps its activations. The chosen blocks are evenly spread (50 is every other
block, 25 every fourth); the blocks are alike, so the activation memory saved and the
forward rerun both grow with the share. A model cell (flashwatt.models.cell) takes
`recompute` as true (100), false (0) or a share; the governed steps' controller turns the
same share (flashwatt.models.step_knobs).
"""
from __future__ import annotations

import numbers

ALL = 100  # every block: what `recompute: true` means


def recompute_percent(value) -> int:
    """A recompute setting as the percent of the blocks it recomputes: true is 100, false 0,
    a whole number 0-100 itself. Anything else (150, a fraction such as 0.5) is a ValueError
    that says what is allowed."""
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b":  # numpy's too (a table's)
        return ALL if value else 0
    if isinstance(value, numbers.Integral) and 0 <= value <= ALL:
        return int(value)
    raise ValueError(f"{value!r} is not allowed; give a whole percent of the decoder blocks, 1-100 (e.g. 50; 0 is "
                     "none), or true/false (every block / none)")


def recompute_words(value) -> str:
    """How tables and figures name a setting: '' for none, 'recompute' for every block,
    'recompute 50%' for a share (a table's old true/false reads as 100/0)."""
    share = recompute_percent(value)
    return "" if not share else "recompute" if share == ALL else f"recompute {share}%"


def recomputed_blocks(count: int, share: int) -> list[int]:
    """Indices of the blocks recomputed at `share` percent of `count`, evenly spread."""
    return [i for i in range(count) if (i * share) // 100 != ((i + 1) * share) // 100]


def checkpoint_blocks(blocks, share: int) -> list[int]:
    """Set each block's checkpoint flag: on for the blocks `recomputed_blocks` names at
    `share`, off for the others; their indices. The model's checkpoint function must be set
    (`enable_recompute`)."""
    chosen = recomputed_blocks(len(blocks), share)
    on = set(chosen)
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i in on
    return chosen


def enable_recompute(model, share: int = ALL) -> list[int]:
    """Activation checkpointing (non-reentrant) of `share` percent of the model's decoder
    blocks (`checkpoint_blocks`); the indices of those recomputed. Under FSDP2 it is set
    before the sharding: transformers checkpoints a block's `forward`, inside the hooks
    `fully_shard` adds to its call."""
    from flashwatt.models.fsdp import decoder_blocks

    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.23 on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return checkpoint_blocks(decoder_blocks(model), share)


def checkpointed_blocks(model) -> list[int]:
    """Indices of the model's decoder blocks whose checkpoint flag is set: the blocks its
    training step recomputes, as the record says."""
    from flashwatt.models.fsdp import decoder_blocks

    return [i for i, block in enumerate(decoder_blocks(model)) if getattr(block, "gradient_checkpointing", False)]
