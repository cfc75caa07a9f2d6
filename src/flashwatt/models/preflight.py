"""Why a model cell cannot run here, asked before its model is built: by the one-GPU job
(flashwatt.models.job) and, per rank, by the multi-GPU one (flashwatt.models.parallel_job)."""
from __future__ import annotations

from flashwatt.models.cell import ModelCell, refusal_without_cuda


def why_not(cell: ModelCell, shape, device, telemetry=None) -> str | None:
    """Why the cell cannot run here (before the model is built), or None."""
    from flashwatt.kernels import AttentionCall, get_kernel
    from flashwatt.models.attention import REGISTRY

    if device.type == "cpu" and refusal_without_cuda(cell) is not None:
        return refusal_without_cuda(cell)
    if cell.seq_len > shape.max_positions:
        return f"context {cell.seq_len} is longer than {cell.model}'s {shape.max_positions} positions"
    if cell.compiled and device.type != "cuda":
        return "torch.compile cells run on a GPU only"
    if cell.phase == "decode" and (cell.backend in REGISTRY or cell.control is not None):
        return (f"{cell.backend} runs self-attention over a whole context only (a decode step's query reads a KV "
                "cache); eager and sdpa_default decode")
    if cell.governor and cell.gpus == 1 and (telemetry is None or not telemetry.available):
        return (f"governor {cell.governor}: the step-level controller needs live power readings from NVML "
                f"({getattr(telemetry, 'reason', None) or 'no telemetry'})")
    if cell.control is not None:
        if device.type != "cuda":
            return f"{cell.backend}: the controller runs on a CUDA device (running on {device.type})"
        if telemetry is None or not telemetry.available:
            return (f"{cell.backend}: the controller needs live power readings from NVML "
                    f"({getattr(telemetry, 'reason', None) or 'no telemetry'})")
    if cell.backend in REGISTRY:  # the registry's answer for the model's attention calls
        call = AttentionCall(precision=cell.precision, seq_len=cell.seq_len, batch=cell.batch, heads=shape.heads,
                             head_dim=shape.head_dim, causal=True, pass_="fwd_bwd" if cell.phase == "train" else "fwd",
                             kv_heads=shape.kv_heads)
        return get_kernel(cell.backend).supports(call, device)
    return None  # transformers' own eager and SDPA run anywhere
