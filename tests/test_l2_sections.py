"""How the custom kernels' work order is cut into L2 sections (flashwatt.kernels.l2_sections),
and a Python model of the order itself (kernels/tile_schedule.cuh `section_item`) that shows
it visits every (block, pair) exactly once with the longest blocks of a section first."""
import pytest

from flashwatt.kernels import l2_sections

H100_L2 = 50 * 1024 * 1024
A100_L2 = 40 * 1024 * 1024


def test_budget_is_32_mib_or_two_thirds_of_a_smaller_cache():
    assert l2_sections.budget(H100_L2) == 32 << 20
    assert l2_sections.budget(A100_L2) == A100_L2 * 2 // 3
    assert l2_sections.budget(6 << 20) == 4 << 20
    # the forward without a mask: 8 MiB, or two thirds of a smaller cache
    full = l2_sections.FULL_SECTION_BUDGET_BYTES
    assert l2_sections.budget(H100_L2, full) == l2_sections.budget(A100_L2, full) == 8 << 20
    assert l2_sections.budget(6 << 20, full) == 4 << 20


def test_forward_section_without_a_mask_keeps_8_mib():
    # L 512, D 128, bf16: 256 KiB per head, so 32 heads per section without a mask, 128 with one
    assert l2_sections.forward_section(512, 512, 128, 2, 1, H100_L2, causal=False) == 32
    assert l2_sections.forward_section(512, 512, 128, 2, 1, H100_L2, causal=True) == 128
    assert l2_sections.forward_section(512, 512, 128, 2, 1, H100_L2) == 128
    # Llama-3.2-1B prefill, 8192 keys: 2 MiB of K and V per k/v head, a quarter per query head
    assert l2_sections.forward_section(32, 8192, 64, 2, 4, H100_L2, causal=False) == 16


def test_forward_section_holds_the_k_and_v_of_its_heads_within_the_budget():
    # L 1024, D 128, bf16: K and V of one head are 512 KiB, so 64 heads fill 32 MiB.
    assert l2_sections.forward_section(256, 1024, 128, 2, 1, H100_L2) == 64
    # a k/v head shared by 4 query heads counts a quarter per query head
    assert l2_sections.forward_section(1024, 1024, 128, 2, 4, H100_L2) == 256
    # a head larger than the budget still makes a section of one
    assert l2_sections.forward_section(8, 1 << 20, 128, 2, 1, H100_L2) == 1
    # fewer pairs than fit: one section of all of them
    assert l2_sections.forward_section(16, 1024, 128, 2, 1, H100_L2) == 16


def test_backward_section_holds_q_do_and_the_fp32_accumulator_of_its_group():
    # L 1024, D 128, bf16: Q and dO 256 KiB each, dQ accumulator 512 KiB, LSE and delta 8 KiB.
    per_pair = 1024 * (128 * 8 + 8)
    widest = (32 << 20) // per_pair  # 31: 256 pairs in 9 sections of 29 (the last 24)
    assert widest == 31
    assert l2_sections.backward_section(256, 1024, 128, 2, 1, H100_L2) == 29
    assert l2_sections.backward_section(31, 1024, 128, 2, 1, H100_L2) == 31
    assert l2_sections.backward_section(256, 1024, 128, 2, 8, H100_L2) == (32 << 20) // (8 * per_pair)
    assert l2_sections.backward_section(16, 16384, 128, 2, 1, H100_L2) == 1


@pytest.mark.parametrize("pairs", [1, 2, 63, 64, 65, 128, 129, 1000])
def test_sections_are_of_equal_width_within_one_and_each_fits(pairs):
    # the seed shape's backward: 532 KiB per pair, 63 fit; 128 pairs make 43 + 43 + 42, not 63 + 63 + 2
    per_pair = 1024 * (64 * 8 + 8)
    width = l2_sections.backward_section(pairs, 1024, 64, 2, 1, H100_L2)
    assert width * per_pair <= (32 << 20)
    sections = -(-pairs // width)
    last = pairs - (sections - 1) * width
    assert width - last <= sections - 1 and last >= 1  # the last section is at most a pair per section narrower
    assert sections == -(-pairs // 63)  # no more sections than the budget needs
    if pairs == 128:
        assert width == 43


@pytest.mark.parametrize("bad", [-1, 2.0, True, "4"])
def test_a_bad_section_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="l2_section"):
        l2_sections.check(bad)


@pytest.mark.parametrize("ok", [None, 0, 1, 7])
def test_good_sections_pass(ok):
    l2_sections.check(ok)


def section_item(item: int, blocks: int, pairs: int, section: int) -> tuple[int, int]:
    """kernels/tile_schedule.cuh section_item, line for line."""
    if section <= 0 or section > pairs:
        section = pairs
    per_section = section * blocks
    s, in_section = divmod(item, per_section)
    first = s * section
    width = min(section, pairs - first)
    rank = in_section // width
    return rank, first + (in_section - rank * width)


@pytest.mark.parametrize("blocks,pairs,section", [(8, 12, 5), (8, 12, 1), (8, 12, 0), (3, 7, 7), (1, 5, 2), (5, 1, 3)])
def test_the_order_visits_every_block_of_every_pair_once(blocks, pairs, section):
    order = [section_item(i, blocks, pairs, section) for i in range(blocks * pairs)]
    assert sorted(order) == [(b, p) for b in range(blocks) for p in range(pairs)]
    width = section if 0 < section <= pairs else pairs
    for start in range(0, pairs, width):
        # a section's items are consecutive, ranks non-decreasing (longest first)
        items = [i for i, (_, p) in enumerate(order) if start <= p < start + width]
        assert items == list(range(items[0], items[0] + len(items)))
        assert [order[i][0] for i in items] == sorted(order[i][0] for i in items)


def test_one_section_is_the_order_before_sections():
    # every pair of the first block, then every pair of the second, ...
    assert [section_item(i, 3, 4, 0) for i in range(12)] == [(i // 4, i % 4) for i in range(12)]
