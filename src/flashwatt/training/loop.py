"""The training loop of one training cell: steps, evaluations, checkpoints, divergence.

Each step: the batch of (seed, step) (flashwatt.training.shards), forward under autocast
to the cell's precision with float32 weights, cross-entropy in float32, backward
(through a gradient scaler for fp16), gradient clipping, the optimizer and the schedule.
The loss of each step stays on the GPU until the next evaluation, where the steps of the
segment are read at once (one synchronisation per evaluation, none per step) and checked:
the first non-finite loss ends the run as `diverged` at that step.

Evaluations: at step 0 (the initial loss, the same for every backend on the same seed)
and at `evals` points spread evenly over the run, the last at the final step; each is the
mean cross-entropy over the suite's fixed validation windows, and reads the run's clocks
and energy (flashwatt.training.meter). A checkpoint is saved after an evaluation when
`checkpoint_every_s` of wall time have passed since the last one (0: at every evaluation).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashwatt.training.cell import TrainCell

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_of(precision: str, device: torch.device):
    """A factory of the context each forward runs in."""
    if precision not in AUTOCAST:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=AUTOCAST[precision])


def eval_points(total_steps: int, evals: int) -> list[int]:
    """The steps after which the run is evaluated: 0, then `evals` points evenly spread, the
    last at total_steps (fewer when the run has fewer steps)."""
    return sorted({0, *(round(i * total_steps / evals) for i in range(1, evals + 1))})


@dataclass
class Batches:
    """What the loop reads: training batches by step, and the validation windows."""
    sampler: object          # flashwatt.training.shards.BatchSampler
    val_inputs: torch.Tensor  # (windows, context), on the device
    val_targets: torch.Tensor
    eval_batch: int


def evaluate(model, data: Batches, autocast) -> float:
    """Mean cross-entropy (nats per token) over the validation windows."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=data.val_inputs.device)
    with torch.no_grad():
        for i in range(0, len(data.val_inputs), data.eval_batch):
            x, y = data.val_inputs[i:i + data.eval_batch], data.val_targets[i:i + data.eval_batch]
            with autocast():
                logits = model(input_ids=x, use_cache=False).logits
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").double()
    model.train(was_training)
    return float(total) / data.val_targets.numel()


class Trainer:
    """One run: model, optimizer, schedule, scaler, and the run's record so far."""

    def __init__(self, cell: TrainCell, model, optimizer, schedule, data: Batches, device: torch.device,
                 grad_clip: float):
        self.cell, self.model, self.optimizer, self.schedule = cell, model, optimizer, schedule
        self.data, self.device, self.grad_clip = data, device, grad_clip
        self.autocast = autocast_of(cell.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cell.precision == "fp16")
        self.step = 0
        self.curve: list[dict] = []
        self.steps: list[dict] = []  # one row per step: the trace
        self.diverged: dict | None = None
        self.controller = None  # a flashwatt.control Controller the steps run under, or None
        self.before_step = None  # called before each step under it (a budget schedule's follower)

    # -- state ---------------------------------------------------------------------------
    def state(self) -> dict:
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {"step": self.step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(), "scaler": self.scaler.state_dict(), "rng": rng,
                "curve": self.curve, "steps": self.steps}

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["cpu"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.step, self.curve, self.steps = state["step"], state["curve"], state["steps"]

    # -- work ----------------------------------------------------------------------------
    def train_until(self, stop: int) -> None:
        """Steps self.step .. stop - 1; then reads their losses and stops at the first
        non-finite one. Under a controller (`self.controller`, flashwatt.control), each step
        is one of its steps: paced, and split into the micro-batches its plan says."""
        self.model.train()
        losses, rates, first = [], [], self.step
        for step in range(first, stop):
            inputs, targets = self.data.sampler.batch(step)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            rates.append(self.optimizer.param_groups[0]["lr"])
            if self.controller is None:
                loss = self._one_step(inputs, targets, None)
            else:
                if self.before_step is not None:
                    self.before_step()
                loss = self.controller.step(lambda plan: self._one_step(inputs, targets, plan),
                                            tokens=self.cell.tokens_per_step)
            losses.append(loss)
        values = torch.stack(losses).double().cpu().tolist() if losses else []
        per_step = self.cell.tokens_per_step
        for offset, (value, lr) in enumerate(zip(values, rates)):
            step = first + offset
            self.steps.append({"step": step, "tokens": (step + 1) * per_step, "loss": value, "lr": lr})
            if not math.isfinite(value):
                self.diverged = {"step": step, "loss": value, "where": "training loss"}
                self.step = step + 1
                return
        self.step = stop

    def _one_step(self, inputs: torch.Tensor, targets: torch.Tensor, plan) -> torch.Tensor:
        """Forward, backward (gradients accumulated over the plan's micro-batches), clipping,
        the optimizer and the schedule; the step's mean loss (not synchronised)."""
        model, optimizer, scaler = self.model, self.optimizer, self.scaler
        parts = plan.micro_batches if plan is not None else 1
        if inputs.shape[0] % parts:
            from flashwatt.kernels.base import UnsupportedCell

            raise UnsupportedCell(f"batch {inputs.shape[0]} does not split into {parts} micro-batches")
        total = torch.zeros((), device=inputs.device)
        for x, y in zip(inputs.chunk(parts), targets.chunk(parts)):
            with self.autocast():
                logits = model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / parts
            scaler.scale(loss).backward()
            total = total + loss.detach()
        if self.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        return total

    def segment_loss(self, since: int) -> float | None:
        """Mean training loss of the steps since step `since` (None at step 0)."""
        values = [r["loss"] for r in self.steps[since:]]
        return sum(values) / len(values) if values else None

    def evaluate(self) -> float:
        if self.controller is None:
            return evaluate(self.model, self.data, self.autocast)
        # paced as the steps are (the budget holds through evaluations too), nothing else changed
        return self.controller.step(lambda: evaluate(self.model, self.data, self.autocast), name="evaluation",
                                    pacing_only=True)
