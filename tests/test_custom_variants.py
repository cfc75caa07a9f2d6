"""Resolution of the custom kernel's named variants (pure Python: no GPU needed)."""
from __future__ import annotations

import pytest

from flashwatt.kernels.custom_variants import (
    DEFAULT_TILE, HOPPER_MATH, LOCKSTEP, PING_PONG, TILES, VARIANTS, WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG,
    WGMMA, WGMMA_DEFAULT_TILE, WGMMA_FP8_RSUM, WS_SCHEDULES, default_tile, parse_variant,
)

HOPPER, AMPERE, ADA = (9, 0), (8, 0), (8, 9)


@pytest.mark.parametrize("precision,D", [("fp16", 64), ("bf16", 64), ("fp16", 128), ("bf16", 128)])
def test_defaults_per_capability(precision, D):
    hopper = parse_variant("", precision, D, HOPPER)
    assert hopper.tile_name == WGMMA_DEFAULT_TILE[(precision, D)][-1][1] and hopper.tile.mma == WGMMA
    for cap in (AMPERE, ADA, None):
        launch = parse_variant("", precision, D, cap)
        assert launch.tile.mma == "mma.sync" and launch.tile_name == DEFAULT_TILE[(precision, D)]


def test_hopper_defaults_name_wgmma_tiles_that_fit():
    for (precision, D), choices in WGMMA_DEFAULT_TILE.items():
        bounds = [bound for bound, _, _ in choices]
        assert bounds[-1] is None and all(b is not None for b in bounds[:-1]) and bounds[:-1] == sorted(bounds[:-1])
        for _, full, causal in choices:
            for name in (full, causal):
                tile = TILES[name]
                assert tile.mma in HOPPER_MATH and D in tile.head_dims and precision in tile.precisions


def test_the_fp8_default_at_head_dim_64_takes_three_consumers_but_for_short_causal_rows():
    """Three consumers, three stages and the row sums on the tensor cores but under a causal
    mask to 1024 keys (two consumers)."""
    rsum, two = "wgmma_fp8_ws_pp_m192_n128_s3_rsum", "wgmma_fp8_ws_pp_m128_n128_s3"
    assert DEFAULT_TILE[("fp8", 64)] == rsum
    assert TILES[rsum].mma == WGMMA_FP8_RSUM and TILES[rsum].block_m == 192
    for len_k in (1, 512, 1024, 1025, 4096, 100_000):
        assert parse_variant("", "fp8", 64, HOPPER, len_k).tile_name == rsum
        assert parse_variant("", "fp8", 64, HOPPER, len_k, causal=True).tile_name == (two if len_k <= 1024 else rsum)


def test_the_fp8_default_at_head_dim_128_takes_three_consumers_but_for_causal_rows_to_4096_keys():
    """Three consumers without a mask at every length and under a causal mask from 4097 keys;
    two under a causal mask to 4096."""
    three, two = "wgmma_fp8_ws_pp_m192_n128_s2", "wgmma_fp8_ws_pp_m128_n128_s2"
    assert DEFAULT_TILE[("fp8", 128)] == three
    assert TILES[three].block_m == 192 and 128 in TILES[three].head_dims
    for len_k in (1, 1000, 4096, 4097, 100_000):
        assert parse_variant("", "fp8", 128, HOPPER, len_k).tile_name == three
        assert parse_variant("", "fp8", 128, HOPPER, len_k, causal=True).tile_name == (two if len_k <= 4096 else three)


def test_hopper_default_follows_the_key_length_and_the_mask():
    ((b1, every, every_c),) = WGMMA_DEFAULT_TILE[("bf16", 128)]
    assert b1 is None and every == every_c  # the causal order comes from the tile counter (work_order)
    for len_k in (1, 1024, 1025, 16384, None):
        for causal in (False, True):
            assert parse_variant("", "bf16", 128, HOPPER, len_k, causal).tile_name == every
    (b0, tiny, tiny_c), (b1, long, long_c) = WGMMA_DEFAULT_TILE[("bf16", 64)]
    assert (b0, b1) == (256, None) and tiny == tiny_c != long == long_c
    assert TILES[long].block_m == 192 and TILES[tiny].block_m == 128
    assert parse_variant("", "bf16", 64, HOPPER, 100_000).tile_name == long
    for causal in (False, True):
        assert parse_variant("", "bf16", 64, HOPPER, 256, causal=causal).tile_name == tiny
        assert parse_variant("", "bf16", 64, HOPPER, 257, causal=causal).tile_name == long
        assert parse_variant("", "bf16", 64, HOPPER, 512, causal=causal).tile_name == long
    assert parse_variant("ctas66", "bf16", 128, HOPPER, 1000).tile_name == WGMMA_DEFAULT_TILE[("bf16", 128)][0][1]
    assert default_tile("bf16", 128, False, 1024) == DEFAULT_TILE[("bf16", 128)]  # off Hopper: no length rule
    assert default_tile("bf16", 128, False, 1024, causal=True) == DEFAULT_TILE[("bf16", 128)]
    assert parse_variant("", "bf16", 128, ADA, 1024).tile_name == DEFAULT_TILE[("bf16", 128)]


def test_paths_without_wgmma_keep_their_default_on_hopper():
    assert parse_variant("", "fp32", 64, HOPPER).tile_name == "f32"
    assert parse_variant("", "bf16", 256, HOPPER).tile_name == DEFAULT_TILE[("bf16", 256)]


def test_fp32_is_exact_and_tf32_is_its_own_opt_in_tile():
    assert parse_variant("", "fp32", 128, AMPERE).tile.mma == "ffma"
    assert parse_variant("", "tf32", 128, AMPERE).tile.mma == "mma.sync.tf32"
    with pytest.raises(ValueError, match="runs tf32, not fp32"):
        parse_variant("tf32", "fp32", 64, AMPERE)
    with pytest.raises(ValueError, match="runs fp32, not tf32"):
        parse_variant("f32", "tf32", 64, AMPERE)
    with pytest.raises(ValueError, match="no default for precision tf32 and head_dim 256"):
        parse_variant("", "tf32", 256, AMPERE)


def test_wgmma_tile_is_refused_off_hopper_with_the_reason():
    with pytest.raises(ValueError, match=r"wgmma.*9\.0.*8\.9"):
        parse_variant("wgmma_m128_n128_s2", "bf16", 128, ADA)
    assert parse_variant("wgmma_m128_n128_s2", "bf16", 128, HOPPER).tile.block_n == 128


def test_caps_combine_with_a_wgmma_tile_and_with_the_hopper_default():
    launch = parse_variant("wgmma_m128_n64_s3_sm1", "fp16", 64, HOPPER)
    assert (launch.tile_name, launch.ctas_per_sm, launch.max_ctas) == ("wgmma_m128_n64_s3", 1, 0)
    launch = parse_variant("ctas66", "bf16", 128, HOPPER)
    assert launch.tile_name == WGMMA_DEFAULT_TILE[("bf16", 128)][-1][1]
    assert launch.max_ctas == 66


def test_wgmma_tiles_are_consistent_with_the_compiled_shapes():
    for name, tile in TILES.items():
        if tile.mma == WGMMA:
            assert name in VARIANTS and VARIANTS[name]["mma"] == WGMMA
            producer = 4 if tile.schedule in WS_SCHEDULES else 0  # the producer warpgroup
            assert tile.block_m % 64 == 0 and tile.warps == 4 * tile.block_m // 64 + producer, name
            assert set(tile.head_dims) <= {64, 128} and tile.precisions == ("fp16", "bf16"), name


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="unknown custom variant"):
        parse_variant("wgmma_m999", "bf16", 64, HOPPER)
    with pytest.raises(ValueError, match="head_dim"):
        parse_variant("wgmma_m192_n64_s2", "bf16", 64, HOPPER)
    with pytest.raises(ValueError, match="fp32"):
        parse_variant("wgmma_m128_n128_s2", "fp32", 64, HOPPER)


def test_tiles_summing_rows_of_p_on_the_tensor_cores_take_rows_of_any_length():
    """They sum each tile afresh and add the tiles in fp32 (flash_fwd_fp8_ws.cuh, RSUM), where
    a sum over the whole row in the fp8 accumulator had to refuse rows past 1024 keys."""
    rsum = [name for name, tile in TILES.items() if tile.mma == WGMMA_FP8_RSUM]
    assert len(rsum) == 2
    for name in rsum:
        for causal in (False, True):
            assert parse_variant(name, "fp8", 64, HOPPER, 65536, causal).tile_name == name


def test_ping_pong_tiles_have_what_the_lagging_warpgroup_needs():
    """kernels/flash_fwd_wgmma.cuh and flash_fwd_fp8.cuh: a second warpgroup to lag, and a K/V
    stage more than lockstep needs (the static_asserts in WgShape and Fp8Shape)."""
    schedules = {tile.schedule for tile in TILES.values()}
    assert schedules == {LOCKSTEP, PING_PONG, WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG}
    for name, tile in TILES.items():
        if tile.schedule == PING_PONG:
            assert tile.mma in HOPPER_MATH and tile.block_m // 64 >= 2 and tile.stages >= 3, name
            assert VARIANTS[name]["schedule"] == PING_PONG


def test_warp_specialized_tiles_match_the_kernel():
    """kernels/flash_fwd_wgmma_ws.cuh (WsShape): 2 consumer warpgroups (128 q rows), or 3
    (192 rows, 160 registers each: D * block_n at most 64 * 128), + a producer warpgroup, Q double-buffered plus K and V rings of <stages> slots in at most
    227 KB of shared memory, and the Hopper defaults that use them. (The fp8 ones:
    tests/test_fp8_precision.py.)"""
    ws = {name: tile for name, tile in TILES.items() if tile.schedule in WS_SCHEDULES and "fp8" not in tile.precisions}
    assert len(ws) >= 2 and {t.schedule for t in ws.values()} == set(WS_SCHEDULES)
    for name, tile in ws.items():
        assert name.startswith("wgmma_ws_") and tile.mma == WGMMA, name
        assert (tile.block_m, tile.warps) in ((128, 12), (192, 16)), name
        assert tile.block_n in (64, 128) and tile.stages >= 2, name
        if tile.block_m == 192:  # 160 registers per consumer: S, O and P of D * BN <= 64 * 128
            assert all(D * tile.block_n <= 64 * 128 for D in tile.head_dims), name
        for D in tile.head_dims:
            smem = 2 * tile.block_m * D * 2 + 2 * tile.stages * tile.block_n * D * 2 + 1024
            assert smem <= 227 * 1024, (name, D, smem)
        assert parse_variant(name, "bf16", tile.head_dims[0], HOPPER).tile is tile
        assert parse_variant(f"{name}_ctas3", "fp16", tile.head_dims[0], HOPPER).max_ctas == 3
        with pytest.raises(ValueError, match="wgmma"):
            parse_variant(name, "bf16", tile.head_dims[0], AMPERE)
    # Defaults where the H100 measured them ahead (kernels/NOTES.md v6, "L2 sections", "Head
    # dim 64: three consumer warpgroups", "A tile counter for causal persistent grids"):
    # persistent at every length, with and without a mask.
    for (precision, D), choices in WGMMA_DEFAULT_TILE.items():
        for bound, full, causal in choices:
            persistent = {n for n, t in TILES.items() if t.schedule in WS_SCHEDULES and precision in t.precisions}
            assert full in persistent and causal in persistent, (precision, D, bound, full, causal)


def test_work_order_takes_a_counter_only_for_causal_persistent_tiles():
    from flashwatt.kernels.custom_variants import (
        TILES, WORK_FIXED_STRIDE, WORK_ONE_CTA_PER_TILE, WORK_TILE_COUNTER, WS_SCHEDULES, work_order,
    )

    persistent = [t for t in TILES.values() if t.schedule in WS_SCHEDULES]
    one_per_tile = [t for t in TILES.values() if t.schedule not in WS_SCHEDULES]
    assert persistent and one_per_tile
    for t in persistent:
        assert work_order(t, True) == work_order(t, True, 1024) == WORK_TILE_COUNTER
        assert work_order(t, True, 1023) == work_order(t, False) == work_order(t, False, 4096) == WORK_FIXED_STRIDE
    for t in one_per_tile:
        assert work_order(t, True, 4096) == work_order(t, False) == WORK_ONE_CTA_PER_TILE


def test_a_view_the_kernel_can_read_goes_as_it_is_and_any_other_is_copied():
    """16-byte loads need a contiguous head dim, a 16-byte aligned start and every other
    stride a multiple of 16 bytes; views meeting that are not copied (a copy per call costs
    the model its memory traffic), others are made contiguous."""
    import torch

    from flashwatt.kernels.custom_inputs import kernel_ready

    blhd = torch.zeros(2, 64, 8, 64, dtype=torch.bfloat16)
    for view in (blhd, blhd.transpose(1, 2), blhd[:, 8:40], blhd[:, :, 2:6]):
        assert kernel_ready(view) is view
    misaligned = torch.zeros(2 * 64 * 8 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 8, 64)
    odd_stride = torch.zeros(2, 64, 8, 68, dtype=torch.bfloat16)[..., :60]  # a row of 120 bytes
    strided_d = blhd[..., ::2]
    for view in (misaligned, odd_stride, strided_d):
        ready = kernel_ready(view)
        assert ready is not view and ready.is_contiguous() and torch.equal(ready, view)
        assert ready.data_ptr() % 16 == 0
