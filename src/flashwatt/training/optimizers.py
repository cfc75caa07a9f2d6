"""The optimizers a training run may name, each built the same way.

    optimizer = make_optimizer("adamw", model.parameters(), lr=3e-4, weight_decay=0.1)

Weight decay goes to matrices only (parameters of two or more dimensions: linear and
embedding weights), not to biases and normalisation gains: decaying those pulls a layer's
scale and offset towards zero for no regularising benefit, and it is what GPT-2/3 and
most language-model recipes since do. So every optimizer gets two parameter groups.

- `adamw`: torch.optim.AdamW, fused (one kernel for the whole update) when every
  parameter is on a CUDA device, else the multi-tensor `foreach` path. Betas (0.9, 0.95),
  the usual language-model choice: the second moment follows changing gradient scales
  faster than with 0.999, which keeps long runs steadier.
- `lion`: Lion (Chen et al., 2023) from the `lion_pytorch` package, betas (0.9, 0.99) as
  its authors advise. It takes the sign of its update, so it wants a learning rate 3-10x
  smaller and a weight decay 3-10x larger than AdamW for the same effect.

Another optimizer is one entry in OPTIMIZERS: its builder and default betas.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

if TYPE_CHECKING:  # torch is imported when an optimizer is made: the config reads OPTIMIZERS without it
    import torch


def parameter_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list[dict]:
    """Trainable parameters in two groups: matrices (decayed) and the rest (not). Groups
    with no parameter are left out; each group keeps the parameters' order."""
    decayed, kept = [], []
    for p in params:
        if p.requires_grad:
            (decayed if p.ndim >= 2 else kept).append(p)
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _adamw(groups: list[dict], lr: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    on_gpu = all(p.is_cuda for g in groups for p in g["params"])
    import torch

    # fused and foreach are exclusive; fused needs every tensor on a CUDA device.
    path = {"fused": True} if on_gpu else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **path)


def _lion(groups: list[dict], lr: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    from lion_pytorch import Lion

    return Lion(groups, lr=lr, betas=betas)


class OptimizerKind(NamedTuple):
    build: Callable[[list[dict], float, tuple[float, float]], "torch.optim.Optimizer"]
    default_betas: tuple[float, float]


OPTIMIZERS = {
    "adamw": OptimizerKind(_adamw, (0.9, 0.95)),
    "lion": OptimizerKind(_lion, (0.9, 0.99)),
}


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float, weight_decay: float,
                   betas: tuple[float, float] | None = None) -> torch.optim.Optimizer:
    """The optimizer `name` over `params` (e.g. model.parameters()), at peak learning rate
    `lr` (a schedule scales it), weight decay on matrices only, `betas` or the optimizer's
    default. A ValueError names what is wrong and what is allowed."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    if not lr > 0:
        raise ValueError(f"learning rate {lr} must be positive")
    if not weight_decay >= 0:
        raise ValueError(f"weight decay {weight_decay} must be zero or positive")
    betas = OPTIMIZERS[name].default_betas if betas is None else tuple(float(b) for b in betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas {betas} must be two numbers in [0, 1)")
    groups = parameter_groups(params, weight_decay)
    if not groups:
        raise ValueError("no trainable parameter to optimize")
    return OPTIMIZERS[name].build(groups, lr, betas)
