"""A step of a model on several GPUs, built and timed like a one-GPU step
(flashwatt.models.step): prefill (the forward of each rank's part, the logits of its last
position only) or train (forward with this rank's loss term, backward, for context
parallelism the gradient all-reduce, then the optimizer), each phase between CUDA
events (perf_counter on CPU) on every rank.

A timed step starts after a barrier, so every rank's phases cover the same step; the
communication inside forward and backward (FSDP's gathers and reduce-scatters, the
attention's transfers) is part of those phases, and its share is measured apart
(flashwatt.models.comm_timeline).
"""
from __future__ import annotations

import torch

from flashwatt.models.step import StepClock


class ParallelStep:
    """One step of `phase` on this rank's part of the global batch `tokens`; `run()` does
    it, `timed(clock)` does it after a barrier and returns its phases in ms."""

    def __init__(self, parallel, tokens: torch.Tensor, phase: str, optimizer: torch.optim.Optimizer | None = None):
        self.parallel = parallel
        self.model = parallel.model
        self.batch = parallel.batch(tokens)
        self.phase = phase
        self.optimizer = optimizer
        if phase == "train":
            sync = ("grad_sync",) if parallel.context_parallel else ()
            self.parts = ("forward", "backward", *sync, "optimizer")
        else:
            self.parts = ("forward",)

    def _go(self, clock: StepClock | None) -> None:
        mark = clock.mark if clock else (lambda: None)
        parallel = self.parallel
        mark()
        if self.phase == "prefill":
            with torch.no_grad():
                parallel.forward(self.batch, logits_to_keep=1)
            mark()
            return
        loss = parallel.loss(parallel.forward(self.batch), self.batch)
        mark()
        loss.backward()
        mark()
        if parallel.context_parallel:
            parallel.sync_gradients()
            mark()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mark()

    def run(self) -> None:
        self._go(None)

    def timed(self, clock: StepClock) -> dict[str, float]:
        from flashwatt.distributed.timing import barrier

        barrier(next(self.model.parameters()).device)
        self._go(clock)
        spans = clock.spans()
        return dict(zip(self.parts, spans)) | {"step": sum(spans)}
