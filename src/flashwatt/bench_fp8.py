"""The fp8 rows of `python -m flashwatt.bench --dtypes fp8`: which runs a shape gets, the fp8
peers, and the printed line (flashwatt.bench times and checks them with every other run).

Per shape, in the same rotated rounds, on the same bf16 inputs:

    sdpa_flash        FlashAttention-2 at bf16: the reference every output is checked against
    custom@bf16       our bf16 forward (the issue's baseline: fp8 at 1.6x it at D128 from 4k keys)
    custom            our fp8 call: quantisation (amax, scale, cast, V^T) and kernel, as a user
                      passing bf16 gets it
    custom:attention  the fp8 kernel alone, on operands quantised before the timing
    custom:quantize   the quantisation alone
    custom:<tile>     each fp8 tile (whole calls)
    sdpa_cudnn        cuDNN at bf16
    cudnn_fp8         cuDNN's fp8 attention through its Python frontend, where it is installed
                      (the wheel nvidia-cudnn-frontend in .whl/; flashwatt.bench_peers)

fp8 outputs are held to TOLERANCE["fp8"] against the reference's bf16 output.
"""
from __future__ import annotations

import math

from flashwatt.kernels.custom_variants import TILES

# A launch that times one part of a call alone (flashwatt.kernels.custom.Custom.parts).
PART = "part:"
REFERENCE = "sdpa_flash"
PEERS = ("cudnn_fp8",)


def fp8_runs(with_tiles: bool, head_dim: int) -> list[tuple[str, str, str, str]]:
    """(kernel, tile variant, launch, precision) of a shape's runs, the reference first."""
    runs = [(REFERENCE, "", "", "bf16"), ("custom", "", "", "bf16"), ("custom", "", "", "fp8"),
            ("custom", "", PART + "attention", "fp8"), ("custom", "", PART + "quantize", "fp8"),
            ("sdpa_cudnn", "", "", "bf16")]
    if with_tiles:
        runs += [("custom", name, "", "fp8") for name, tile in TILES.items()
                 if "fp8" in tile.precisions and head_dim in tile.head_dims]
    runs += [(peer, "", "", "fp8") for peer in PEERS]
    return runs


def peer_kernel(name: str):
    """The kernel object of an fp8 peer (None: not a peer)."""
    if name == "cudnn_fp8":
        from flashwatt.bench_peers import CudnnFp8

        return CudnnFp8()
    return None


def fp8_header() -> str:
    return (f"{'dtype':5} {'B':>3} {'H':>5} {'L':>6} {'D':>4} {'mask':6} {'fp8':>8} {'kernel':>8} {'bf16':>8} "
            f"{'fp8/bf16':>8} {'kern/bf16':>9} {'quant%':>6} {'tile':>8} {'best':>8} {'cudnn':>8} {'cudnn8':>8}")


def short_tile(name: str) -> str:
    """An fp8 tile's name without what every fp8 tile shares: wgmma_fp8_ws_pp_m128_n128_s3 -> ws_pp_s3."""
    return name.removeprefix("wgmma_fp8_").replace("m128_n128_", "")


def fp8_summary_line(result: dict[str, float], shape: tuple, causal: bool) -> str:
    """One shape's printed row: TFLOP/s of the fp8 call (quantisation included), of its kernel
    alone, of our bf16 forward; the two ratios; the quantisation's share of the call's time;
    the best fp8 tile's whole call and its name (short_tile); cuDNN at bf16 and cuDNN's fp8 peer."""
    B, H, L, D, Hkv = shape
    heads = f"{H}/{Hkv}" if Hkv != H else f"{H}"
    fp8, kern, bf16 = result.get("custom", math.nan), result.get("custom:attention", math.nan), \
        result.get("custom@bf16", math.nan)
    quant = result.get("custom:quantize", math.nan)
    # TFLOP/s are the call's FLOPs over each part's time: time shares are the inverse ratios.
    quant_share = fp8 / quant * 100 if quant == quant and quant else math.nan
    tiles = {n.removeprefix("custom:"): t for n, t in result.items() if n.startswith("custom:wgmma_fp8") and t == t}
    best = max(tiles, key=tiles.get, default="")
    return (f"{'fp8':5} {B:>3} {heads:>5} {L:>6} {D:>4} {'causal' if causal else 'full':6} {fp8:8.1f} {kern:8.1f} "
            f"{bf16:8.1f} {fp8 / bf16:8.3f} {kern / bf16:9.3f} {quant_share:6.1f} {tiles.get(best, math.nan):8.1f} "
            f"{short_tile(best) or '-':>8} {result.get('sdpa_cudnn', math.nan):8.1f} "
            f"{result.get('cudnn_fp8', math.nan):8.1f}")
