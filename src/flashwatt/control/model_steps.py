"""The controller's model steps: `Controller.step(fn)` governs any step function.

    with Controller(mode="budget", budget_w=450) as ctl:
        ctl.attach(model)                          # optional: the model's own knobs
        for batch in loader:
            loss = ctl.step(lambda plan: train_step(batch, plan), tokens=batch.numel())

A step is one "call" of the governor's loop, of a shape of its own: ("step", what it
runs, tokens per step, the model's precision). Its configuration (flashwatt.control.
configuration.step_candidates) is what the step may change:
- the attention backend inside the attached model, through the backend registry;
- micro-batches with gradient accumulation, where the user's knobs allow more than one:
  `fn(plan)` reads `plan.micro_batches` (a step function that takes no plan cannot split);
- activation recompute on a share of the attached model's blocks (`plan.recompute`
  percent), where the knobs allow it; a configuration that runs out of memory is
  refused for the step, so a recomputing one takes over when memory favours it;
- a cheaper precision (tf32, autocast to bf16) only with `precision_tolerance`, after the
  step's probe (`precision_probe`, or the attached model's logits on a fixed batch) agreed
  with the model's own precision within it.
Pacing (the duty) paces between steps and, on an attached model, within them: a pacing
point where each of its blocks begins, forward and backward (`pace()` for one's own
points). Pacing is a host-side sleep between launches (flashwatt.control.pacing): inside a
CUDA graph being captured or a torch.compile'd region it does nothing, so a graphed or
compiled step is paced between steps.

A step's GPU time is taken with device stamps around it, less the idle time paced inside
it (the first steps of a configuration synchronously, the very first dropped); its tokens
are spread over the ticks it ran in (flashwatt.control.step_credit). At most one step is
queued ahead of the GPU.

A part of flashwatt.control.controller.Controller (a mixin).
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable

import torch

from flashwatt.control.attention_calls import SYNC_TIMED
from flashwatt.control.configuration import KEEP_BACKEND, Configuration, ControlError
from flashwatt.kernels.base import UnsupportedCell

# Each refusal removes one configuration; a step has at most this many to try.
MAX_TRIES = 64


class PeerLost(ControlError):
    """Another rank of the job stopped answering and the job was set to end then."""


class ModelSteps:
    """`Controller.step`, `attach` and `pace` (module docstring)."""

    def _init_steps(self) -> None:
        self._knobs = None  # the attached model's knobs (flashwatt.models.step_knobs.ModelKnobs)
        self._hooks: list = []
        self._in_step = False
        self._last_step_end = None
        self._probe_base: dict[tuple, torch.Tensor] = {}

    # ---- attaching a model --------------------------------------------------------------
    def attach(self, model: Any, precision: str | None = None, train: bool | None = None) -> None:
        """Govern this model's knobs too: its attention backend (through the registry), its
        blocks' recompute, and pacing points where its blocks begin. `model` is a transformers
        model (or a flashwatt.models.step_knobs.ModelKnobs); `precision` and `train` default
        to its parameters' dtype and its training mode."""
        if self._knobs is not None:
            raise ControlError("a model is attached already: one controller governs one model's steps")
        if isinstance(model, torch.nn.Module):
            from flashwatt.models.step_knobs import ModelKnobs

            model = ModelKnobs(model, precision, train)
        self._knobs = model
        self._hooks = model.pacing_hooks(self.pace)

    def _detach_steps(self) -> None:
        for handle in getattr(self, "_hooks", []):
            handle.remove()
        self._hooks = []

    def pace(self) -> None:
        """A point inside a step where pacing may idle the GPU (the attached model's blocks
        call it; a step function may call it between its own launches). Nothing outside a
        step, inside a CUDA graph capture or a compiled region."""
        if self._in_step:
            self._pacer.point()

    # ---- the step -----------------------------------------------------------------------
    def step(self, fn: Callable, tokens: int | None = None, name: str | None = None, pacing_only: bool = False) -> Any:
        """Run one step under the controller; what `fn` returns. `fn()` or `fn(plan)` (the
        configuration it runs: plan.micro_batches, plan.recompute, plan.backend,
        plan.precision); `tokens` per step (default 1: throughput in steps per second);
        `name` what the step runs (default: the attached model, else "step");
        `pacing_only`: paced, and nothing of the model changed (an evaluation between
        training steps: it runs on whatever the training steps run)."""
        self._raise_fault()
        self.governor.watch_stalls = True  # a step is the GPU's whole work (flashwatt.control.work_stall)
        takes_plan = _takes_plan(fn)
        shape = self._step_shape(name, tokens) + (("pacing only",) if pacing_only else ())
        for _ in range(MAX_TRIES):
            config = self.governor.config_for(shape)
            refusal = self._step_refusal(config, takes_plan)
            if refusal is None and config.precision:
                refusal = self._step_precision_refusal(shape, config)
            if refusal is not None:
                self.governor.forbid(shape, config, refusal)
                continue
            try:
                return self._run_step(shape, config, fn, takes_plan)
            except UnsupportedCell as err:
                self._after_failure(shape, config, str(err))
            except torch.cuda.OutOfMemoryError as err:
                self._after_failure(shape, config, f"out of memory: {str(err).splitlines()[0]}")
        raise ControlError(f"no configuration could run step {shape} ({'; '.join(self.refusals().values())})")

    def _step_shape(self, name: str | None, tokens: int | None) -> tuple:
        if tokens is not None and (isinstance(tokens, bool) or not int(tokens) > 0):
            raise ControlError(f"tokens={tokens!r}: give the step's tokens, a positive whole number")
        what = name or (self._knobs.signature if self._knobs is not None else "step")
        precision = self._knobs.precision if self._knobs is not None else ""
        return ("step", what, int(tokens or 1), precision)

    def _step_refusal(self, config: Configuration, takes_plan: bool) -> str | None:
        if config.chunks > 1 and not takes_plan:
            return (f"{config.chunks} micro-batches: the step function takes no plan, so it cannot split its "
                    "batch (give fn(plan) and read plan.micro_batches)")
        if self._knobs is None and (config.recompute or config.backend != KEEP_BACKEND):
            return f"{config.label}: no model attached (Controller.attach) to change"
        return self._knobs.refusal(config) if self._knobs is not None else None

    def _after_failure(self, shape: tuple, config: Configuration, reason: str) -> None:
        """A configuration failed inside a step: nothing of the step is kept (the attached
        model's gradients are cleared), and the configuration is forbidden for the step."""
        self._in_step = False
        with self._lock:
            self._credit.abort()
        if self._knobs is not None:
            self._knobs.after_failure()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.governor.forbid(shape, config, reason)

    def _run_step(self, shape: tuple, config: Configuration, fn: Callable, takes_plan: bool) -> Any:
        key, tokens = (shape, config), shape[2]
        if self._knobs is not None:
            self._knobs.apply(config)
        n = self._calls[key]
        with self._lock:
            self._credit.begin(shape, config, tokens, self._clock())
        self._pacer.resume()
        slept_before = self._pacer.slept_s
        start = self._ops.stamp()
        self._in_step = True
        try:
            with self._step_precision(config):
                out = fn(config) if takes_plan else fn()
        finally:
            self._in_step = False
        end = self._ops.stamp()
        slept = self._pacer.slept_s - slept_before
        if n < SYNC_TIMED:  # a configuration's first steps, timed synchronously (the 1st dropped)
            self._ops.wait(end)
            if n >= 1:
                self.governor.on_latency(shape, config, max(0.0, self._ops.seconds(start, end) - slept), tokens)
        else:
            with self._lock:
                self._pending.append((shape, config, tokens, start, end, slept))
        self._calls[key] = n + 1
        self.calls += 1
        self.tokens += tokens
        if self._last_step_end is not None:  # at most one step queued ahead of the GPU
            self._ops.wait(self._last_step_end)
        self._last_step_end = end
        done = []  # the step's tokens are credited once the queue has drained (or at once at full duty)
        self._pacer.point(drained=lambda: done.append(self._step_done()))
        self._pacer.step_ended()  # (the host's time until the next step is the GPU's idle, where drained)
        if not done:  # no pacing point here (a capture or a compiled region reported): credit it now
            self._step_done()
        return out

    def _step_done(self) -> None:
        with self._lock:
            self._credit.end(self._clock(), self._work)

    # ---- precision ----------------------------------------------------------------------
    def _step_precision(self, config: Configuration):
        """The context a step runs in at the configuration's precision rung (none: its own)."""
        if not config.precision:
            return contextlib.nullcontext()
        return precision_rung(config.precision, self.device.type)

    def _probe(self) -> Callable[[], torch.Tensor] | None:
        if self.precision_probe is not None:
            return self.precision_probe
        return self._knobs.probe if self._knobs is not None else None

    def _step_precision_refusal(self, shape: tuple, config: Configuration) -> str | None:
        """The probe under the rung against the model's own precision, on the configuration's
        first step and every `recheck_every` steps after."""
        n = self._calls[(shape, config)]
        if n % self.recheck_every:
            return None
        probe = self._probe()
        if probe is None:
            return ("precision: a step's cheaper precision is checked by a probe; give precision_probe "
                    "or attach the model")
        with torch.no_grad():
            if shape not in self._probe_base:
                self._probe_base[shape] = probe().double()
            base = self._probe_base[shape]
            with precision_rung(config.precision, self.device.type):
                got = probe().double()
        err = float(torch.linalg.vector_norm(got - base) / torch.linalg.vector_norm(base))
        ok = err <= self.precision_tolerance  # NaN never passes
        self._checks.append({"config": config.label, "shape": str(shape), "call": n, "rel_err": err,
                             "tolerance": self.precision_tolerance, "passed": ok,
                             "against": "the model's own precision (the step's probe)"})
        return None if ok else f"precision check failed: rel_err {err:.3g} > tolerance {self.precision_tolerance:g}"

    def _raise_fault(self) -> None:
        fault = self.fault()
        if fault is not None and fault.get("action") == "ended":
            raise PeerLost(f"the job's power was shared with ranks that stopped answering ({fault['error']}); "
                           "on_peer_loss='end' ends the job (on_peer_loss='continue' paces each rank alone "
                           "within its share of the budget)")


@contextlib.contextmanager
def precision_rung(precision: str, device_type: str):
    """tf32 matmuls (and cuDNN convolutions) or autocast to bf16/fp16, restored after."""
    if precision == "tf32":
        before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        return
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with torch.autocast(device_type, dtype=dtype):
        yield


def _takes_plan(fn: Callable) -> bool:
    """Whether `fn` takes the plan: it has a positional parameter (`step.run(plan=None)` does)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(parameters) and parameters[0].kind in (parameters[0].POSITIONAL_ONLY,
                                                       parameters[0].POSITIONAL_OR_KEYWORD)
