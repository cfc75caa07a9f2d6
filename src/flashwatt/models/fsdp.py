"""FSDP2 sharding of a transformers model: `fully_shard` on every decoder block, then on the
root (embeddings, final norm and LM head, tied or not, in the root's group).

The mixed precision policy keeps the model's own dtype for the parameters the blocks
compute with and for the gradients' reduce-scatter: a bf16 cell trains in bf16 on every
GPU as it does on one (weights, activations, gradients and AdamW's states in the cell's
precision). Each block's parameters are gathered before its forward and freed after it
(reshard_after_forward), and gathered again for its backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def decoder_blocks(model) -> torch.nn.ModuleList:
    """The model's list of decoder blocks (model.layers of a Llama, transformer.h of a GPT-2)."""
    count = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"no list of {count} decoder blocks in {type(model).__name__}")


def shard_model(model, mesh=None) -> dict:
    """Shard `model` in place over `mesh` (default: every rank, one dimension); returns
    what was done, for the record."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = next(model.parameters()).dtype
    if mesh is None:
        kind = "cuda" if dist.get_backend() == "nccl" else "cpu"
        mesh = init_device_mesh(kind, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    blocks = decoder_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    return {"units": len(blocks) + 1, "param_dtype": str(dtype).replace("torch.", ""),
            "reduce_dtype": str(dtype).replace("torch.", ""), "reshard_after_forward": True,
            "mesh": [dist.get_world_size()]}

