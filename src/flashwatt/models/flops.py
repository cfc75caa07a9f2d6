"""Model FLOPs of a step, and MFU against the device's dense peak.

The formula (PaLM, appendix B; the one Megatron and nanoGPT report against), written
into every record beside its result:

    matmul FLOPs per token  = 2 * N_matmul                    (forward)
    attention FLOPs per token = 4 * layers * L * heads * head_dim   (QKᵀ and PV, forward)
                              halved for a causal mask (half the score matrix exists)
    train = 3 x forward (backward = 2 x forward)

N_matmul counts the parameters a token multiplies by: every weight matrix of the blocks
and the LM head (once more when it is tied to the embedding, whose lookup is not a
matmul), not the embedding tables and not norms or biases (O(hidden) work, below the
formula's resolution). A prefill that keeps the logits of the last position only runs
the LM head on one token per sequence, and is counted so. A decode step makes one token
per sequence, whose query attends to all L cached keys and itself (no causal halving).
"""
from __future__ import annotations

from flashwatt.models.presets import Shape

FORMULA = ("forward FLOPs = 2*N_matmul*tokens + 4*layers*L*heads*head_dim*tokens (x0.5 causal); "
           "train = 3 x forward; decode: one token per sequence over L+1 keys, not halved; "
           "N_matmul = block weight matrices + LM head")

# Dense (no sparsity) tensor-core peak from the datasheets, TFLOP/s, by device-name
# substring and precision; a device not listed gets no MFU rather than a guessed one.
DENSE_PEAK_TFLOPS = {
    ("H100 SXM", "bf16"): 989.4, ("H100 SXM", "fp16"): 989.4, ("H100 SXM", "tf32"): 494.7, ("H100 SXM", "fp32"): 66.9,
    ("H100 80GB HBM3", "bf16"): 989.4, ("H100 80GB HBM3", "fp16"): 989.4, ("H100 80GB HBM3", "tf32"): 494.7,
    ("H100 80GB HBM3", "fp32"): 66.9,
    ("H200", "bf16"): 989.4, ("H200", "fp16"): 989.4, ("H200", "tf32"): 494.7, ("H200", "fp32"): 66.9,
    ("H100 PCIe", "bf16"): 756.0, ("H100 PCIe", "fp16"): 756.0, ("H100 PCIe", "tf32"): 378.0,
    ("H100 PCIe", "fp32"): 51.2,
    ("A100", "bf16"): 312.0, ("A100", "fp16"): 312.0, ("A100", "tf32"): 156.0, ("A100", "fp32"): 19.5,
}


def step_flops(shape: Shape, body_matmul: int, batch: int, seq_len: int, phase: str, causal: bool = True,
               logits_of_last_only: bool = False) -> dict:
    """FLOPs of one step of `phase`: "prefill" or "train" on batch x seq_len tokens,
    "decode" on one new token per sequence after a context of seq_len."""
    if phase == "decode":
        tokens, keys, half = batch, seq_len + 1, 1.0
    else:
        tokens, keys, half = batch * seq_len, seq_len, (0.5 if causal else 1.0)
    head_tokens = batch if logits_of_last_only else tokens
    attention = 4 * shape.layers * keys * shape.heads * shape.head_dim * tokens * half
    forward = 2 * body_matmul * tokens + 2 * shape.vocab * shape.hidden * head_tokens + attention
    factor = {"prefill": 1, "decode": 1, "train": 3}[phase]
    return {"total": factor * forward, "attention": factor * attention, "per_token": factor * forward / tokens,
            "formula": FORMULA}


def dense_peak_tflops(device_name: str | None, precision: str) -> float | None:
    if not device_name:
        return None
    for (family, dtype), peak in DENSE_PEAK_TFLOPS.items():
        if family in device_name and dtype == precision:
            return peak
    return None


def step_utilisation(shape: Shape, body_matmul: int, batch: int, seq_len: int, phase: str, step_s: float,
                     device_name: str | None, precision: str, gpus: int = 1) -> dict:
    """A measured step's FLOPs (causal), achieved TFLOP/s and MFU against the dense peak of
    all `gpus` GPUs (the step's batch is over all of them); a prefill's LM head runs on one
    token per sequence."""
    flops = step_flops(shape, body_matmul, batch, seq_len, phase, causal=True, logits_of_last_only=phase != "train")
    peak = dense_peak_tflops(device_name, precision)
    flops["achieved_tflops"] = flops["total"] / step_s / 1e12
    flops["peak_tflops"] = peak * gpus if peak else None
    flops["mfu"] = flops["achieved_tflops"] / flops["peak_tflops"] if peak else None
    if gpus > 1:
        flops["peak_of"] = f"{gpus} GPUs"
    return flops

