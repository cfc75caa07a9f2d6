"""Is the model on several GPUs computing the model? Its loss, logits and gradients against
one process running the same weights on the same global batch.

`parallel_pass` and `single_pass` run one forward (and backward) each way and return the
loss (the mean over every token), the logits of the whole global batch (gathered from
the ranks) and whole gradients (gathered from the shards under fsdp, summed over the
ranks under context parallelism): the tests compare every tensor of a tiny model in
float64 and float32 with them.

`check_parallel` is a multi-GPU cell's check, the rule of flashwatt.models.check on the
cell's own weights before anything is timed: rank 0 runs one process's model in the
cell's precision with SDPA's math backend (the baseline) and in float32 (float64 on
CPU, the reference); the parallel model passes when its logits' and the middle block's
gradients' errors against the reference are at most twice the baseline's plus the
precision's floor. A causality probe replaces the second half of every check sequence:
the gathered logits of the first half must not move (what a strategy that attended to
the wrong positions, or a rank that saw a later rank's keys, would do).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from flashwatt.distributed.rank_zero import from_rank_zero
from flashwatt.models.check import CAUSAL_LEAK, CHECK_TOKENS, FLOOR, math_sdpa, middle_block, rel_error, verdict
from flashwatt.models.parallel import next_token_labels, token_loss


def _grads(named, names, full) -> dict[str, torch.Tensor]:
    return {n: full(p).detach().clone() for n, p in named if n in names}


def parallel_pass(parallel, ids: torch.Tensor, train: bool, names=None) -> dict:
    """Loss, gathered logits and whole gradients (of `names`, default every parameter) of
    the parallel model on the global batch `ids` (every rank calls it with the same ids)."""
    model = parallel.model
    names = set(names) if names is not None else {n for n, _ in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    batch = parallel.batch(ids)
    with torch.set_grad_enabled(train):
        logits = parallel.forward(batch)
        loss = parallel.loss(logits, batch)
    out = {"loss": parallel.global_loss(loss), "logits": parallel.gather_logits(logits)}
    if train:
        loss.backward()
        parallel.sync_gradients()
        out["grads"] = _grads(model.named_parameters(), names, parallel.full_gradient)
        for p in model.parameters():
            p.grad = None
    return out


def single_pass(model, ids: torch.Tensor, train: bool, names=None) -> dict:
    """The same on one process: the whole global batch through `model`."""
    names = set(names) if names is not None else {n for n, _ in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    with torch.set_grad_enabled(train):
        logits = model(input_ids=ids, use_cache=False).logits
        loss = token_loss(logits, next_token_labels(ids), ids.shape[0] * (ids.shape[1] - 1))
    out = {"loss": float(loss.detach()), "logits": logits.detach()}
    if train:
        loss.backward()
        out["grads"] = _grads(model.named_parameters(), names, lambda p: p.grad)
        for p in model.parameters():
            p.grad = None
    return out


def check_length(strategy: str, world: int, max_positions: int) -> int:
    """Tokens per check sequence: at most CHECK_TOKENS and the model's positions, cut to a
    multiple of 2 x the world size (every strategy's layout can take it)."""
    step = 2 * world
    return min(CHECK_TOKENS, max_positions) // step * step


def check_parallel(parallel, build_single, reference_factory, precision: str, vocab: int, max_positions: int,
                   train: bool, seed: int) -> dict:
    """The check of a multi-GPU cell (module docstring); the same result on every rank.

    build_single() returns, on rank 0, one process's model in the cell's precision with
    the weights the parallel model started from; reference_factory(model) the function
    that builds its float32 (float64 on CPU) copy (flashwatt.models.step.reference_factory)."""
    world = dist.get_world_size()
    device = next(parallel.model.parameters()).device
    length = check_length(parallel.strategy, world, max_positions)
    rows = world if parallel.strategy == "fsdp" else 1
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=gen).to(device)
    half = length // 2
    changed = ids.clone()
    changed[:, half:] = torch.randint(0, vocab, (rows, length - half), generator=gen).to(device)
    block = middle_block(parallel.model)
    names = [n for n, _ in parallel.model.named_parameters() if n.startswith(block)]

    was_training = parallel.model.training
    parallel.model.train(train)
    try:
        got = parallel_pass(parallel, ids, train, names)
        same_way = parallel_pass(parallel, ids, False)["logits"] if train else got["logits"]
        moved = parallel_pass(parallel, changed, False)["logits"]
    finally:
        parallel.model.train(was_training)

    result, failure = None, None
    if dist.get_rank() == 0:
        try:
            one = _one_process(build_single, reference_factory, ids, train, names, block, device)
            result = _verdicts(got, one["base"], one["ref"], moved, same_way, half, precision, train, block) | {
                "tokens": length, "sequences": rows, "through": f"{parallel.strategy} over {world} ranks",
                "reference": f"one process, transformers SDPA math backend, {one['ref_precision']}"}
        except Exception as err:  # told to every rank, so that none waits for rank 0 in vain
            failure = err
    # Rank 0's one-process run may outlast any collective: the others wait on the rank-0 group.
    shared = from_rank_zero(result if failure is None else {"failed": f"{type(failure).__name__}: {failure}"})
    if failure is not None:
        raise failure
    if "failed" in shared:
        raise RuntimeError(f"the check's one-process run on rank 0 failed: {shared['failed']}")
    return shared


def _one_process(build_single, reference_factory, ids, train, names, block, device) -> dict:
    """Rank 0: the baseline (cell precision) and the reference (float32/float64) on one process."""
    single = build_single()
    for n, p in single.named_parameters():
        p.requires_grad_(n.startswith(block))
    single.train(train)
    with math_sdpa(single):
        base = single_pass(single, ids, train, names)
    reference = reference_factory(single)()
    del single
    for n, p in reference.named_parameters():
        p.requires_grad_(n.startswith(block))
    reference.train(train)
    with math_sdpa(reference):
        ref = single_pass(reference, ids, train, names)
    ref_precision = "fp64" if next(reference.parameters()).dtype == torch.float64 else "fp32"
    del reference
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"base": base, "ref": ref, "ref_precision": ref_precision}


def _verdicts(got, base, ref, moved, same_way, half, precision, train, block) -> dict:
    result: dict = {"rule": "error <= 2 x (one process, same precision, math backend) + floor",
                    "floor": FLOOR[precision]}
    error, baseline = rel_error(got["logits"], ref["logits"]), rel_error(base["logits"], ref["logits"])
    result["logits"] = {"error": error, "baseline_error": baseline}
    result["logits"]["passed"], result["logits"]["tolerance"] = verdict(error, baseline, precision)
    result["loss"] = {"value": got["loss"], "reference": ref["loss"], "baseline": base["loss"],
                      "abs_error": abs(got["loss"] - ref["loss"])}
    prefix = float((moved[:, :half] - same_way[:, :half]).abs().max())
    suffix = float((moved[:, half:] - same_way[:, half:]).abs().max())
    result["causal"] = {"prefix_change": prefix, "suffix_change": suffix,
                        "passed": bool(suffix > 0 and prefix <= CAUSAL_LEAK * suffix), "leak_allowed": CAUSAL_LEAK}
    if train:
        flat = lambda grads: torch.cat([grads[n].double().flatten() for n in sorted(grads)])  # noqa: E731
        error = rel_error(flat(got["grads"]), flat(ref["grads"]))
        baseline = rel_error(flat(base["grads"]), flat(ref["grads"]))
        result["grad"] = {"block": block.rstrip("."), "error": error, "baseline_error": baseline}
        result["grad"]["passed"], result["grad"]["tolerance"] = verdict(error, baseline, precision)
    result["passed"] = all(result[k]["passed"] for k in ("logits", "causal", "grad") if k in result)
    return result
