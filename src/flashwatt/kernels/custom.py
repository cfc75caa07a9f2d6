"""flashwatt's own FlashAttention kernels: the registry backend `Custom` and the public names
of the modules below it.

fp16/bf16 run on tensor cores with fp32 accumulation through mma.sync (FlashAttention-2
style); on Hopper (compute capability 9.0, an sm_90a build) the `wgmma_` tiles run a
wgmma kernel (kernels/flash_fwd_wgmma.cuh), the `wgmma_pp_` ones with the warpgroups in
ping-pong, the `wgmma_ws_` ones a warp-specialised persistent kernel (a producer warpgroup
that copies with TMA, mbarriers; kernels/flash_fwd_wgmma_ws.cuh), and a wgmma tile is the
fp16/bf16 default there (by head dim and key length).
fp32 runs an exact FFMA path; the opt-in tf32 precision runs fp32 inputs on tensor cores,
rounded to tf32 (kernels/flash_fwd_tf32.cuh, d64/d128). The opt-in fp8 precision quantises
16-bit inputs to e4m3 in the call (one scale per head) and runs a wgmma kernel with e4m3
operands, Hopper only, head dims 64 and 128, forward only (flashwatt.kernels.custom_fp8). Head dims 64, 128 and 256; causal
and full masks, a causal mask aligned top-left (the default, as torch's is_causal: query i
sees keys 0 .. i) or bottom-right (causal_align="bottom_right", as FlashAttention >= 2.1 and
torch's causal_lower_right: query i sees keys 0 .. i + Lk - Lq; a query that sees no key gets
an output of 0, zero gradients and an LSE of -inf: custom_mask); any sequence length; (B, H, L, D)
and (B, L, H, D) layouts through strides; grouped-query attention (q heads a multiple of
k/v heads). The backward (flashwatt.kernels.custom_backward: CUDA kernels for fp16/bf16 at
head dims 64, 128 and 256, wgmma ones on Hopper at 64 and 128, an exact PyTorch path from the
saved LSE for fp32 and tf32) makes `Custom` differentiable wherever its forward runs, through
flashwatt.kernels.custom_autograd.

The modules, bottom up (each imports only those before it):
    custom_inputs     what the kernels accept: input checks, precision, device properties
    custom_mask       the causal mask's alignment (top-left, bottom-right)
    custom_variants   tiles and named launch variants (pure Python)
    custom_fp8        the fp8 forward: quantisation, pre-quantised inputs, refusals
    custom_forward    flash_forward, kernel_info
    custom_backward   backward plans and tiles, flash_backward, the PyTorch path from the LSE
    custom_autograd   flash_attention: the differentiable operation (imports torch)
    custom            this module: the registry backend, and the names above re-exported
                      (all but flash_attention, which needs torch at import)
"""
from __future__ import annotations

from flashwatt.kernels.call import AttentionCall
from flashwatt.kernels.custom_backward import backward_kernel_info, backward_plan
from flashwatt.kernels.custom_forward import flash_forward, kernel_info
from flashwatt.kernels.custom_fp8 import FP8_CAPABILITY, FP8_HEAD_DIMS, flash_forward_fp8, fp8_refusal
from flashwatt.kernels.custom_inputs import (
    HEAD_DIMS, PRECISIONS, capability, check_inputs, device_properties, kernel_ready, precision_of,
)
from flashwatt.kernels.custom_mask import (
    CAUSAL_ALIGNS, CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, causal_offset, causal_visible, check_causal_align,
)
from flashwatt.kernels.custom_variants import (
    DEFAULT_TILE, FFMA, LOCKSTEP, MMA_SYNC, MMA_TF32, PING_PONG, TILE_COUNTER_MIN_KEYS, TILES, VARIANTS,
    WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG, WGMMA, WGMMA_CAPABILITY, WGMMA_DEFAULT_TILE, WORK_FIXED_STRIDE,
    WORK_ONE_CTA_PER_TILE, WORK_TILE_COUNTER, WS_SCHEDULES, Launch, Tile, check_variant_name, default_tile,
    parse_variant, work_order,
)

__all__ = [
    "Custom",
    # custom_inputs
    "HEAD_DIMS", "PRECISIONS", "capability", "check_inputs", "device_properties", "kernel_ready", "precision_of",
    # custom_mask
    "CAUSAL_ALIGNS", "CAUSAL_BOTTOM_RIGHT", "CAUSAL_TOP_LEFT", "causal_offset", "causal_visible", "check_causal_align",
    # custom_variants
    "DEFAULT_TILE", "FFMA", "LOCKSTEP", "MMA_SYNC", "MMA_TF32", "PING_PONG", "TILE_COUNTER_MIN_KEYS", "TILES",
    "VARIANTS", "WARP_SPECIALIZED", "WARP_SPECIALIZED_PING_PONG", "WGMMA", "WGMMA_CAPABILITY", "WGMMA_DEFAULT_TILE",
    "WORK_FIXED_STRIDE", "WORK_ONE_CTA_PER_TILE", "WORK_TILE_COUNTER", "WS_SCHEDULES", "Launch", "Tile",
    "check_variant_name", "default_tile", "parse_variant", "work_order",
    # custom_fp8
    "FP8_CAPABILITY", "FP8_HEAD_DIMS", "flash_forward_fp8", "fp8_refusal",
    # custom_forward
    "flash_forward", "kernel_info",
    # custom_backward
    "backward_kernel_info", "backward_plan",
]


class Custom:
    name = "custom"
    differentiable = True

    def supports(self, cell: AttentionCall, device) -> str | None:
        if getattr(device, "type", str(device)) != "cuda":
            return f"custom needs a CUDA device (running on {getattr(device, 'type', device)})"
        cap = capability(device)
        if cap < (8, 0):
            return f"custom needs compute capability 8.0 or newer (device has {cap[0]}.{cap[1]})"
        if cell.head_dim not in HEAD_DIMS:
            return f"custom supports head_dim {', '.join(map(str, HEAD_DIMS))} (cell asks for {cell.head_dim})"
        if cell.precision not in PRECISIONS:
            return f"custom runs {', '.join(PRECISIONS)} (cell asks for {cell.precision})"
        if cell.precision == "fp8":
            reason = fp8_refusal(cap, cell.head_dim)
            if reason is not None:
                return reason
            if cell.pass_ == "fwd_bwd":
                return "custom fp8 is a forward only (no backward): fwd cells only"
        if cell.pass_ == "fwd_bwd":
            try:
                backward_plan(cell.precision, cell.head_dim)
            except ValueError as err:
                return str(err)
        try:
            parse_variant(cell.variant, cell.precision, cell.head_dim, cap, cell.seq_len, cell.causal)
        except ValueError as err:
            return str(err)
        return None

    def __call__(self, q, k, v, cell: AttentionCall):
        # Differentiable when a gradient may be asked for; otherwise the plain forward. Imported
        # here: custom_autograd defines a torch.autograd.Function, and config validation
        # imports this module without torch.
        from flashwatt.kernels.custom_autograd import flash_attention

        return flash_attention(q, k, v, cell.causal, cell.variant, precision=cell.precision)

    def parts(self, cell: AttentionCall, inputs: list) -> dict:
        """The parts of an fp8 call, to be timed apart: `quantize` (the 16-bit inputs to e4m3)
        and `attention` (the kernel on operands quantised beforehand), each call(i) on input
        set i % len(inputs); {} for any other precision, whose call is one kernel."""
        if cell.precision != "fp8":
            return {}
        from flashwatt.kernels.custom_fp8 import fp8_forward, quantize

        prepared = [quantize(q, k, v) for q, k, v in inputs]
        return {
            "quantize": lambda i: quantize(*inputs[i % len(inputs)]),
            "attention": lambda i: fp8_forward(prepared[i % len(prepared)], cell.causal, cell.variant,
                                               out_dtype=inputs[0][0].dtype),
        }

    def describe(self, cell: AttentionCall) -> dict:
        """The build (key, build and load seconds), the launch the cell's variant resolved to
        and, for a fwd_bwd cell, the backward's path (CUDA tile or the PyTorch path)."""
        from flashwatt.build import build_info

        details = {"build": build_info(),
                   "launch": kernel_info(cell.precision, cell.head_dim, cell.variant, cell.seq_len, cell.causal)}
        if cell.pass_ == "fwd_bwd":
            details["backward"] = backward_kernel_info(cell.precision, cell.head_dim)
        return details
