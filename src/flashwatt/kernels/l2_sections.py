"""How many (batch, head) pairs the custom kernels' work order puts in one L2 section.

The kernels visit their work in sections of (batch, head) pairs (kernels/tile_schedule.cuh):
every block of a section's pairs before the next section. A section is sized so that what
every block of a pair re-reads fits in a share of the device's L2 cache: the forward's
query tiles all read their head's K and V, the backward's key blocks all read their head's
Q and dO and add into its fp32 dQ accumulator. FlashAttention-3's scheduler sizes its
sections the same way (32 MiB of K and V); the forward without a mask here keeps 8 MiB.

`l2_section` arguments elsewhere: None picks by this module, 0 puts every pair in one
section (the work order before sections: a wave of CTAs spread over as many heads as it
has CTAs), N > 0 asks for N pairs.
"""
from __future__ import annotations

# What a section may keep in L2: at most 32 MiB, and at most two thirds of the cache (the
# rest is for the streams that pass through once: Q and O, or K, V, dK and dV).
SECTION_BUDGET_BYTES = 32 << 20
# The forward without a mask keeps at most 8 MiB of K and V per section. Its work items all
# cost the same, so a narrow section costs nothing in balance, and on an H100 (50 MB of L2)
# the 32 MiB sections left the L2 hit rate at 29% and DRAM 75% busy at 512 keys, head dim
# 128: sections of 16-33 pairs (4-8 MiB) took 62% hits and 40% DRAM and ran 10-15% faster
# from 512 to 1024 keys (kernels/NOTES.md, "L2 sections without a mask"). Under a causal
# mask the longest blocks of each section come first, and narrower sections lost up to 17%.
FULL_SECTION_BUDGET_BYTES = 8 << 20


def budget(l2_bytes: int, cap: int = SECTION_BUDGET_BYTES) -> int:
    return min(cap, l2_bytes * 2 // 3)


def _pairs(pairs: int, bytes_per_pair: float, l2_bytes: int, cap: int = SECTION_BUDGET_BYTES) -> int:
    """Sections of equal width (within one pair) that each fit the budget. A narrow last
    section would come last in the order with its longest causal blocks, and the work
    would end on them (a 16-step block after every SM has finished: the seed shape's
    causal backward lost 10% to it)."""
    widest = max(1, int(budget(l2_bytes, cap) // max(bytes_per_pair, 1.0)))
    if widest >= pairs:
        return pairs
    sections = -(-pairs // widest)
    return -(-pairs // sections)


def forward_section(pairs: int, len_k: int, head_dim: int, element_size: int, group: int, l2_bytes: int,
                    causal: bool = True) -> int:
    """Of `pairs` (batch, query head) pairs, how many per section of the forward: a pair's
    share of its k/v head's K and V (shared by the `group` query heads that read it), within
    the causal or the (smaller) mask-free budget."""
    cap = SECTION_BUDGET_BYTES if causal else FULL_SECTION_BUDGET_BYTES
    return _pairs(pairs, 2 * len_k * head_dim * element_size / group, l2_bytes, cap)


def backward_section(pairs: int, len_q: int, head_dim: int, element_size: int, group: int, l2_bytes: int) -> int:
    """Of `pairs` (batch, k/v head) pairs, how many per section of the backward: the Q, dO,
    fp32 dQ accumulator, LSE and delta rows of the `group` query heads that a k/v head's key
    blocks all walk."""
    return _pairs(pairs, group * len_q * (head_dim * (2 * element_size + 4) + 8), l2_bytes)


def check(l2_section) -> None:
    if l2_section is not None and (not isinstance(l2_section, int) or isinstance(l2_section, bool) or l2_section < 0):
        raise ValueError(f"custom kernel: l2_section must be None (automatic), 0 (one section) or a positive "
                         f"number of (batch, head) pairs, got {l2_section!r}")
