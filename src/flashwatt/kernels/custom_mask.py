"""The causal mask of flashwatt's own kernels, aligned top-left or bottom-right.

Where queries and keys differ in length (len_q != len_k) a causal mask needs an alignment.
Key j is visible to query i iff j <= i + causal_offset(causal_align, len_q, len_k):

- "top_left" (CAUSAL_TOP_LEFT, the default): offset 0. Query i sees keys 0 .. i, as torch's
  `is_causal=True` and torch.nn.attention.bias.causal_upper_left.
- "bottom_right" (CAUSAL_BOTTOM_RIGHT): offset len_k - len_q. The last query sees every key:
  the queries are the last len_q positions of a sequence whose first len_k positions are the
  keys, as in chunked prefill and decoding with a cache (FlashAttention >= 2.1,
  torch.nn.attention.bias.causal_lower_right).

With equal lengths both are the same mask. Bottom-right with len_q > len_k leaves the first
len_q - len_k queries without a key: the kernels give them an output of exactly 0, zero
gradients and an LSE of -inf (the log of an empty sum, as torch.logsumexp gives; the
backward reads it as +inf so that P = 0 rather than NaN: kernels/causal_mask.cuh).
FlashAttention writes +inf there instead; -inf is kept here because it is the value that
drops out when partial results are merged by their LSE (flashwatt.distributed.merge
takes -inf for a row with no key yet).
"""
from __future__ import annotations

CAUSAL_TOP_LEFT = "top_left"
CAUSAL_BOTTOM_RIGHT = "bottom_right"
CAUSAL_ALIGNS = (CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT)


def check_causal_align(causal_align) -> str:
    """causal_align itself if it names an alignment; ValueError naming the allowed ones if not."""
    if not isinstance(causal_align, str) or causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"custom kernel: causal_align must be one of {', '.join(map(repr, CAUSAL_ALIGNS))}, "
                         f"got {causal_align!r}")
    return causal_align


def causal_offset(causal_align: str, len_q: int, len_k: int) -> int:
    """The diagonal's offset: key j is visible to query i iff j <= i + offset."""
    return len_k - len_q if check_causal_align(causal_align) == CAUSAL_BOTTOM_RIGHT else 0


def extension_code(ext, causal_align: str) -> int:
    """The alignment as the compiled extension's CausalAlign (kernels/flash_fwd.cuh)."""
    return {CAUSAL_TOP_LEFT: ext.CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT: ext.CAUSAL_BOTTOM_RIGHT}[causal_align]


def causal_visible(len_q: int, len_k: int, causal_align: str = CAUSAL_TOP_LEFT, device=None):
    """(len_q, len_k) bool tensor, True where a key is visible to a query (torch's attn_mask
    convention), for references and the PyTorch backward."""
    import torch

    offset = causal_offset(causal_align, len_q, len_k)
    return torch.ones(len_q, len_k, dtype=torch.bool, device=device).tril(diagonal=offset)
