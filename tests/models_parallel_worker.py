"""Work run inside each spawned gloo process of tests/test_models_parallel.py.

Every rank builds the same seeded tiny model (Llama; GPT-2 too, whose positions are a
learned table) and global batch, runs one process's
forward and backward on the whole batch (the reference), then, for each strategy, a
fresh copy of the same weights prepared for that strategy (flashwatt.models.parallel),
and compares the loss, the gathered logits and every whole gradient with the
reference. Rank 0 writes a JSON report: the largest relative error of each case and
what the case says about itself (the kv heads expanded, the block that ran).

Recompute of a share of the blocks (half of llama_tiny's two) under fsdp and zigzag: the
same comparison against one process without recompute, the blocks whose checkpoint flag
is set, and how often each block's attention ran in the step (twice where the backward
reran its forward).

A negative control runs zigzag with each rank's positions counted from 0 (what a
context-parallel model that forgot the global positions would do): its error must be
large, or the comparison could not see that mistake. Last, the check's one-process run
fails on rank 0 on purpose: every rank must raise, none wait.
"""
from __future__ import annotations

import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BATCH, LENGTH = 4, 32  # the global batch: 4 sequences (fsdp: 4 / world per rank) of 32 tokens
DTYPES = {"float64": torch.float64, "float32": torch.float32}
RECOMPUTE_SHARE = 50  # percent of the blocks: block 1 of llama_tiny's 2
RECOMPUTE_STRATEGIES = ("fsdp", "zigzag")


def cases(world: int) -> list[tuple[str, str, str, str]]:
    """(name, model, strategy, dtype) for this world size."""
    out = [(f"{s}-float64", "llama_tiny", s, "float64") for s in ("fsdp", "ring", "zigzag", "ulysses")]
    if world == 4:
        out.append(("hybrid-float64", "llama_tiny", "hybrid", "float64"))
    if world == 2:
        out += [("fsdp-float32", "llama_tiny", "fsdp", "float32"),
                ("zigzag-float32", "llama_tiny", "zigzag", "float32"),
                ("gpt2-fsdp-float64", "gpt2_tiny", "fsdp", "float64"),
                ("gpt2-zigzag-float64", "gpt2_tiny", "zigzag", "float64")]
    return out


def _model(name: str, dtype: torch.dtype):
    from flashwatt.models.presets import model_spec
    from flashwatt.models.step import build_model

    return build_model(model_spec(name), "fp32", torch.device("cpu"), seed=0).to(dtype)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def compare(got: dict, ref: dict) -> dict:
    errors = {"loss": abs(got["loss"] - ref["loss"]) / abs(ref["loss"]), "logits": _rel(got["logits"], ref["logits"])}
    missing = set(ref["grads"]) ^ set(got["grads"])
    if missing:
        raise AssertionError(f"gradients missing on one side: {sorted(missing)}")
    errors["grads"] = max(_rel(got["grads"][n], ref["grads"][n]) for n in ref["grads"])
    errors["worst_grad"] = max(ref["grads"], key=lambda n: _rel(got["grads"][n], ref["grads"][n]))
    return errors


def run_case(strategy: str, dtype: torch.dtype, ids: torch.Tensor, reference: dict, model_name: str) -> dict:
    from flashwatt.models.parallel import prepare
    from flashwatt.models.parallel_check import parallel_pass

    model = _model(model_name, dtype)
    model.train()
    parallel = prepare(model, strategy)
    got = parallel_pass(parallel, ids, train=True)
    out = compare(got, reference)
    if parallel.attention is not None:
        out.update(kv_expanded=parallel.attention.kv_expanded, block=parallel.attention.block_name)
    return out


def recompute_case(strategy: str, ids: torch.Tensor, reference: dict) -> dict:
    """`strategy` recomputing RECOMPUTE_SHARE percent of the blocks: the errors against one
    process without recompute, the blocks checkpointed, and each block's attention calls in
    the step (a pre-hook: it counts a rerun even where the recompute stops early)."""
    from flashwatt.models.fsdp import decoder_blocks
    from flashwatt.models.parallel import prepare
    from flashwatt.models.parallel_check import parallel_pass
    from flashwatt.models.recompute import checkpointed_blocks

    model = _model("llama_tiny", torch.float64)
    model.train()
    blocks = decoder_blocks(model)
    calls = [0] * len(blocks)
    for i, block in enumerate(blocks):
        block.self_attn.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    parallel = prepare(model, strategy, recompute=RECOMPUTE_SHARE)
    got = parallel_pass(parallel, ids, train=True)
    return {**compare(got, reference), "checkpointed": checkpointed_blocks(model), "attention_calls": calls}


def rank0_failure(world: int) -> list[str]:
    """What every rank raises when the check's one-process run fails on rank 0."""
    from flashwatt.models.parallel import prepare
    from flashwatt.models.parallel_check import check_parallel

    def planted():
        raise RuntimeError("planted failure on rank 0")

    parallel = prepare(_model("llama_tiny", torch.float64), "ring")
    try:
        check_parallel(parallel, planted, lambda model: None, "fp32", 512, 64, True, seed=0)
        message = "NO ERROR RAISED"
    except Exception as err:
        message = f"{type(err).__name__}: {err}"
    messages = [None] * world
    dist.all_gather_object(messages, message)
    return messages


def main(rank: int, world: int, port: int, report: str) -> None:
    os.environ.update(MULTICAST_OFF)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A rank left waiting for another fails within two minutes instead of hanging the test.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    from flashwatt.models import parallel as parallel_module
    from flashwatt.models.parallel_check import single_pass
    from flashwatt.models.step import random_tokens

    results: dict = {"errors": {}, "failures": {}}
    try:
        ids = random_tokens(512, BATCH, LENGTH, seed=7, device=torch.device("cpu"))
        references: dict = {}

        def reference(model_name: str, dtype: str) -> dict:
            if (model_name, dtype) not in references:
                model = _model(model_name, DTYPES[dtype])
                model.train()
                references[model_name, dtype] = single_pass(model, ids, train=True)
            return references[model_name, dtype]

        for name, model_name, strategy, dtype in cases(world):
            try:
                results["errors"][name] = run_case(strategy, DTYPES[dtype], ids, reference(model_name, dtype),
                                                   model_name)
            except Exception:  # reported per case so one failure does not hide the others
                results["failures"][name] = traceback.format_exc()

        results["recompute"] = {}
        for strategy in RECOMPUTE_STRATEGIES:
            try:
                results["recompute"][strategy] = recompute_case(strategy, ids, reference("llama_tiny", "float64"))
            except Exception:
                results["failures"][f"{strategy}-recompute{RECOMPUTE_SHARE}"] = traceback.format_exc()

        # Negative control: positions counted from 0 on every rank.
        real = parallel_module.global_positions

        def local_positions(strategy, group, batch, length, device):
            return torch.arange(real(strategy, group, batch, length, device).shape[1], device=device).expand(batch, -1)

        parallel_module.global_positions = local_positions
        try:
            results["local_positions"] = run_case("zigzag", torch.float64, ids, reference("llama_tiny", "float64"),
                                                  "llama_tiny")
        finally:
            parallel_module.global_positions = real
        results["rank0_failure"] = rank0_failure(world)
    finally:
        if rank == 0:
            with open(report, "w") as fh:
                json.dump(results, fh, indent=1)
        dist.destroy_process_group()
