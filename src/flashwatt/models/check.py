"""Is the model with this backend computing the model? Three checks on the cell's own
weights, before anything is timed.

1. Logits and loss against a reference: the same weights in float32 (float64 on CPU)
   with transformers' SDPA forced to its math backend. The error allowed is measured,
   not guessed: the same model in the cell's precision with the math backend gives the
   precision's own error (bf16 activations through every layer), and a backend passes
   when its error is at most twice that plus a small floor (`FLOOR`), the rule the
   distributed checks use against one GPU.
2. Causality: the second half of the tokens is replaced; the logits of the first half
   must not move (at most `CAUSAL_LEAK` of how far the second half's moved). This is
   what catches a backend whose causal mask was silently dropped, which with random
   weights can hide inside the logits' error of check 1.
3. For a train cell, the gradients of one block (the middle one) against the reference,
   under the same rule as the logits.
4. For a decode cell, the last token's logits decoded over a KV cache of the tokens
   before it, against the reference's full forward at that position, under the same rule
   (the baseline: that position of the full forward with the math backend, so a cache
   that is dropped or misplaced, by the attention or by transformers, fails).

The check runs on one sequence of at most `CHECK_TOKENS` tokens (the kernels' long-L
numerics are the attention cells' business; here it is the wiring: mask, GQA, layout,
scale), and only the middle block's parameters ask for gradients, so the float32
reference of an 8B model fits beside the model.
"""
from __future__ import annotations

import contextlib

import torch

CHECK_TOKENS = 1024
FLOOR = {"fp64": 1e-10, "fp32": 1e-5, "tf32": 1e-3, "fp16": 2e-3, "bf16": 5e-3}
CAUSAL_LEAK = 1e-3


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


@contextlib.contextmanager
def math_sdpa(model):
    """The model on transformers' SDPA with the math backend forced, restored afterwards."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        model.set_attn_implementation(previous)


def middle_block(model) -> str:
    """Parameter-name prefix of the middle decoder block (model.layers.N. / transformer.h.N.)."""
    blocks = sorted({name.rsplit(".", 1)[0] for name, _ in model.named_parameters()
                     if ".layers." in name or ".h." in name})
    prefix = "model.layers." if any(".layers." in b for b in blocks) else "transformer.h."
    count = 1 + max(int(b[len(prefix):].split(".")[0]) for b in blocks if b.startswith(prefix))
    return f"{prefix}{count // 2}."


def _run(model, ids, train: bool, block: str, forward=None,
         autocast=contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    for p in model.parameters():
        p.grad = None
    with torch.set_grad_enabled(train), autocast():
        # `is None`, not truthiness: a torch.compile'd module refuses len()
        out = (model if forward is None else forward)(input_ids=ids, labels=ids, use_cache=False)
    logits, loss = out.logits.detach(), out.loss.detach()
    grads = None
    if train:
        out.loss.backward()
        grads = torch.cat([p.grad.detach().double().flatten() for n, p in model.named_parameters() if n.startswith(block)])
        for p in model.parameters():
            p.grad = None
    return logits, loss, grads


def verdict(error: float, baseline: float, precision: str) -> tuple[bool, float]:
    tolerance = 2.0 * baseline + FLOOR[precision]
    return (error == error and error <= tolerance), tolerance  # NaN never passes


def _decode_last(model, ids, autocast=contextlib.nullcontext) -> torch.Tensor:
    """Logits of the last token, decoded over a KV cache of the tokens before it."""
    with torch.no_grad(), autocast():
        cache = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        return model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits[:, -1].detach()


def check_model(model, reference_factory, precision: str, vocab: int, train: bool, seed: int,
                forward=None, autocast=None, decode: bool = False) -> dict:
    """Run the three checks on `model` (already on its backend and device).

    reference_factory() returns the reference model (float32 on a GPU, float64 on CPU)
    holding the same weights; it is built here and freed before returning. `forward`: what
    the step calls instead of the model (its torch.compile'd form), checked in its place.
    `autocast`: the context every run of the model (not the reference) is made in, for a
    model trained in mixed precision (float32 weights, `precision` arithmetic). `decode`:
    check 4 as well.
    """
    autocast = autocast or contextlib.nullcontext
    device = next(model.parameters()).device
    from flashwatt.models.presets import shape_of

    length = min(CHECK_TOKENS, shape_of(model.config).max_positions)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=gen).to(device)
    half = length // 2
    changed = ids.clone()
    changed[:, half:] = torch.randint(0, vocab, (1, length - half), generator=gen).to(device)
    block = middle_block(model)

    # Only the middle block asks for gradients: the reference's other grads never exist.
    wanted = {n: p.requires_grad for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith(block))
    was_training = model.training
    model.train(train)
    try:
        logits, loss, grads = _run(model, ids, train, block, forward, autocast)
        # The causality probe compares two forwards run the same way: a compiled model
        # runs another graph with gradients off, whose roundings differ from the train
        # graph's, which is no leak.
        same_way = _run(model, ids, False, block, forward, autocast)[0] if train else logits
        moved, _, _ = _run(model, changed, False, block, forward, autocast)
        decoded = _decode_last(model, ids, autocast) if decode else None
        with math_sdpa(model):
            base_logits, base_loss, base_grads = _run(model, ids, train, block, autocast=autocast)

        reference = reference_factory()
        for n, p in reference.named_parameters():
            p.requires_grad_(n.startswith(block))
        reference.train(train)
        with math_sdpa(reference):
            ref_logits, ref_loss, ref_grads = _run(reference, ids, train, block)
        ref_precision = "fp64" if next(reference.parameters()).dtype == torch.float64 else "fp32"
        del reference
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(wanted[n])
        model.train(was_training)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    result: dict = {"tokens": length, "reference": f"transformers SDPA, math backend, {ref_precision}",
                    "rule": "error <= 2 x (same precision, math backend) + floor", "floor": FLOOR[precision]}
    error, baseline = rel_error(logits, ref_logits), rel_error(base_logits, ref_logits)
    result["logits"] = {"error": error, "baseline_error": baseline}
    result["logits"]["passed"], result["logits"]["tolerance"] = verdict(error, baseline, precision)
    result["loss"] = {"value": float(loss), "reference": float(ref_loss), "baseline": float(base_loss),
                      "abs_error": abs(float(loss) - float(ref_loss))}
    prefix = float((moved[:, :half] - same_way[:, :half]).abs().max())
    suffix = float((moved[:, half:] - same_way[:, half:]).abs().max())
    result["causal"] = {"prefix_change": prefix, "suffix_change": suffix,
                        "passed": bool(suffix > 0 and prefix <= CAUSAL_LEAK * suffix), "leak_allowed": CAUSAL_LEAK}
    if train:
        error, baseline = rel_error(grads, ref_grads), rel_error(base_grads, ref_grads)
        result["grad"] = {"block": block.rstrip("."), "error": error, "baseline_error": baseline}
        result["grad"]["passed"], result["grad"]["tolerance"] = verdict(error, baseline, precision)
    if decode:
        # The baseline is the same position's error of the full forward with the math
        # backend, not a decode: a cache bug in transformers would be in both.
        error, baseline = rel_error(decoded, ref_logits[:, -1]), rel_error(base_logits[:, -1], ref_logits[:, -1])
        result["decode"] = {"error": error, "baseline_error": baseline, "context": length - 1}
        result["decode"]["passed"], result["decode"]["tolerance"] = verdict(error, baseline, precision)
    result["passed"] = all(result[k]["passed"] for k in ("logits", "causal", "grad", "decode") if k in result)
    return result
