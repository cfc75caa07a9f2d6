"""Why a model cell cannot run here, asked before its model is built: by the one-GPU job
(flashwatt.models.job) and, per rank, by the multi-GPU one (flashwatt.models.parallel_job)."""
from __future__ import annotations

from flashwatt.models.cell import ModelCell


def why_not(cell: ModelCell, shape, device, telemetry=None) -> str | None:
    """Why the cell cannot run here (before the model is built), or None."""
    from flashwatt.attention.cell import Cell
    from flashwatt.kernels import get_kernel
    from flashwatt.models.attention import REGISTRY

    if device.type == "cpu" and cell.precision != "fp32":
        return f"on CPU the models run fp32 only (cell asks for {cell.precision})"
    if cell.seq_len > shape.max_positions:
        return f"context {cell.seq_len} is longer than {cell.model}'s {shape.max_positions} positions"
    if cell.compiled and device.type != "cuda":
        return "torch.compile cells run on a GPU only"
    if cell.phase == "decode" and (cell.backend in REGISTRY or cell.control is not None):
        return (f"{cell.backend} runs self-attention over a whole context only (a decode step's query reads a KV "
                "cache); eager and sdpa_default decode")
    if cell.control is not None:
        if device.type != "cuda":
            return f"{cell.backend}: the controller runs on a CUDA device (running on {device.type})"
        if telemetry is None or not telemetry.available:
            return (f"{cell.backend}: the controller needs live power readings from NVML "
                    f"({getattr(telemetry, 'reason', None) or 'no telemetry'})")
    if cell.backend in REGISTRY:
        attention = Cell("model", cell.backend, cell.precision, cell.seq_len, cell.batch, shape.heads, shape.head_dim,
                         True, "fwd_bwd" if cell.phase == "train" else "fwd")
        kernel = get_kernel(cell.backend)
        reason = kernel.supports(attention, device)
        if reason is None and cell.phase == "train" and not kernel.differentiable:
            reason = f"{cell.backend} has no backward pass"
        return reason
    return None  # transformers' own eager and SDPA run anywhere
