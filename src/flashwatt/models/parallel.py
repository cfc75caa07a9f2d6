"""A model on several GPUs (one process each, inside an initialised process group): FSDP2
data parallelism, or context parallelism over flashwatt's distributed attention.

    parallel = prepare(model, "zigzag")           # or "fsdp", "ring", "ulysses", "hybrid"
    batch = parallel.batch(ids)                   # ids: the global batch (B, L), the same on every rank
    logits = parallel.forward(batch)
    loss = parallel.loss(logits, batch)           # this rank's term; the terms sum to the mean loss
    loss.backward(); parallel.sync_gradients()

fsdp: every decoder block, then the root, is sharded with `fully_shard` (FSDP2) over all
ranks, with a mixed precision policy that keeps the model's own dtype for parameters and
for the gradient reduce-scatter (the cell's precision throughout, as on one GPU). Rank r
takes rows r·B'..(r+1)·B' of the global batch (B' = B / world size): a cell's `batch` is
per GPU, its global batch batch x gpus.

Context parallel (ring, zigzag, ulysses, hybrid): every rank holds the whole model
(weights replicated) and its part of every sequence, cut by
`flashwatt.distributed.layout.shard_sequence` exactly as the attention expects it, with the
*global* positions of its tokens as position ids (RoPE and learned positions see where
each token really is). Attention goes through `flashwatt.distributed.attention`
(flashwatt.models.cp_attention). After the backward, the gradients are summed over the
ranks with bucketed all-reduces (`sync_gradients`): replicated weights and an explicit
all-reduce keep the gradient exchange one visible phase of the step, apart from the
attention's own communication. hybrid runs a ring of 2 across Ulysses groups of
world/2 ranks.

The loss is the mean next-token cross-entropy over every token of every rank: labels are
shifted on the global sequence before it is cut (a rank's last token predicts a token
another rank holds), each rank sums its tokens' losses and divides by the global count
(by the count over the world size under fsdp, whose reduce-scatter averages), so the
gradients after the exchange are those of one process running the whole global batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashwatt.models.parallel_layout import CONTEXT_PARALLEL, STRATEGIES, ulysses_size
from flashwatt.models.recompute import enable_recompute, recompute_percent

IGNORE = -100  # a label no token has: the last position of a sequence predicts nothing
BUCKET_BYTES = 64 << 20


def next_token_labels(ids: torch.Tensor) -> torch.Tensor:
    """labels[:, t] = ids[:, t + 1]; the last position gets IGNORE."""
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    return labels


def token_loss(logits: torch.Tensor, labels: torch.Tensor, normaliser: float) -> torch.Tensor:
    """Sum of the cross-entropies of the labelled tokens over `normaliser`, computed in
    float32 (float64 for a float64 model)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(dtype), labels.reshape(-1),
                                              ignore_index=IGNORE, reduction="sum")
    return total / normaliser


@dataclass
class LocalBatch:
    """This rank's part of a global batch: its token ids, their global positions, their
    labels (shifted on the global sequence), and what its summed loss is divided by."""
    ids: torch.Tensor
    positions: torch.Tensor | None
    labels: torch.Tensor
    normaliser: float
    global_shape: tuple[int, int]


def global_positions(strategy: str, group, batch: int, length: int, device) -> torch.Tensor:
    """Position ids of this rank's tokens: its part of 0..L-1, cut as the sequence is."""
    positions = torch.arange(length, device=device).expand(batch, length)
    return _shard_tokens(positions, strategy, group)


def _shard_tokens(x: torch.Tensor, strategy: str, group) -> torch.Tensor:
    """This rank's part of a (B, L) tensor, cut as shard_sequence cuts (B, H, L, D)."""
    from flashwatt.distributed.layout import shard_sequence

    return shard_sequence(x[:, None, :, None], strategy, group)[:, 0, :, 0]


class Parallel:
    """A model prepared for one strategy over the default process group (see the module)."""

    def __init__(self, model, strategy: str, group=None, attention=None, details: dict | None = None):
        self.model = model
        self.strategy = strategy
        self.group = group  # None: the world; a 2-D DeviceMesh for hybrid
        self.attention = attention  # the context-parallel attention function (None under fsdp)
        self.details = details or {}  # what was done, for the record
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()

    @property
    def context_parallel(self) -> bool:
        return self.strategy in CONTEXT_PARALLEL

    def batch(self, ids: torch.Tensor) -> LocalBatch:
        """This rank's part of the global batch `ids` (B, L), the same tensor on every rank."""
        B, L = ids.shape
        labels = next_token_labels(ids)
        counted = B * (L - 1)
        if self.context_parallel:
            return LocalBatch(_shard_tokens(ids, self.strategy, self.group), self.positions(B, L, ids.device),
                              _shard_tokens(labels, self.strategy, self.group), counted, (B, L))
        if B % self.world:
            raise ValueError(f"fsdp: a global batch of {B} sequences does not split over {self.world} ranks")
        rows = slice(self.rank * B // self.world, (self.rank + 1) * B // self.world)
        # The reduce-scatter averages over the ranks: each rank's term is world x its share.
        return LocalBatch(ids[rows], None, labels[rows], counted / self.world, (B, L))

    def positions(self, batch: int, length: int, device) -> torch.Tensor:
        return global_positions(self.strategy, self.group, batch, length, device)

    def forward(self, batch: LocalBatch, logits_to_keep: int = 0) -> torch.Tensor:
        out = self.model(input_ids=batch.ids, position_ids=batch.positions, use_cache=False,
                         logits_to_keep=logits_to_keep)
        return out.logits

    def loss(self, logits: torch.Tensor, batch: LocalBatch) -> torch.Tensor:
        return token_loss(logits, batch.labels, batch.normaliser)

    def global_loss(self, loss: torch.Tensor) -> float:
        """The mean loss over every token of every rank, from this rank's term."""
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total) / (self.world if self.strategy == "fsdp" else 1)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits of the whole global batch (B, L, V) on every rank (a collective)."""
        logits = logits.detach().contiguous()
        if self.context_parallel:
            from flashwatt.distributed.layout import gather_sequence

            return gather_sequence(logits[:, None], self.strategy, self.group)[:, 0]
        parts = [torch.empty_like(logits) for _ in range(self.world)]
        dist.all_gather(parts, logits)
        return torch.cat(parts)

    def sync_gradients(self) -> None:
        """Context parallel: sum every gradient over the ranks (fsdp's reduce-scatter ran in
        the backward already)."""
        if self.context_parallel:
            allreduce_gradients([p for p in self.model.parameters() if p.grad is not None])

    def full_gradient(self, parameter: torch.nn.Parameter) -> torch.Tensor:
        """The whole gradient of a parameter (a collective under fsdp: every rank calls it)."""
        grad = parameter.grad
        return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def allreduce_gradients(parameters: list, bucket_bytes: int = BUCKET_BYTES, group=None) -> None:
    """Sum the gradients of `parameters` over the ranks, in flat buckets of at most
    `bucket_bytes` (one all-reduce each, gradients of one dtype per bucket)."""
    bucket: list[torch.Tensor] = []
    size = 0

    def flush():
        nonlocal bucket, size
        if bucket:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        bucket, size = [], 0

    for p in parameters:
        g = p.grad
        if bucket and (g.dtype != bucket[0].dtype or size + g.numel() * g.element_size() > bucket_bytes):
            flush()
        bucket.append(g)
        size += g.numel() * g.element_size()
    flush()


def prepare(model, strategy: str, block: str = "auto", recompute: int = 0) -> Parallel:
    """Shard `model` (fsdp) or plug the context-parallel attention into it, over the
    default process group. `block`: the attention block the context-parallel strategies
    compute with (flashwatt.distributed.blocks); under fsdp the model keeps the attention
    backend it has. `recompute`: activation checkpointing of that percent of the decoder
    blocks (flashwatt.models.recompute; true is 100, every block), set before the sharding
    as FSDP2 wants it."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    share = recompute_percent(recompute)
    if share:
        enable_recompute(model, share)
    if strategy == "fsdp":
        from flashwatt.models.fsdp import shard_model

        return Parallel(model, strategy, details={"fsdp": shard_model(model)})
    from flashwatt.models.cp_attention import use_context_parallel

    group = None
    if strategy == "hybrid":
        from flashwatt.distributed.groups import default_mesh

        group = default_mesh(ulysses_size(strategy, dist.get_world_size()))
    attention = use_context_parallel(model, strategy, group, block)
    world = dist.get_world_size()
    details = {"block": block, "ulysses_ranks": ulysses_size(strategy, world),
               "ring_ranks": world // ulysses_size(strategy, world),
               "gradients": "replicated weights; gradients summed by bucketed all-reduce after the backward"}
    return Parallel(model, strategy, group, attention, details)
