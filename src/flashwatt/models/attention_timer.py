"""The attention share of a model step, timed by hooks: CUDA events around every attention
call, forward and backward.

The timed attention function wraps the one the model runs (the same kernel, the same
mask function, under its own registered name), so only the markers are added. Backward:
an identity autograd function on the attention output records when its gradient
arrives, one on (q, k, v) records when theirs leave; the span between them is the
attention's backward (the kernel's backward and, where K/V were expanded for GQA, the
reduction of their gradients). A recomputed forward (activation checkpointing) is timed
again, inside the backward: it is attention work the step does. The markers cost a few
microseconds a call, so the share is measured in steps of its own, apart from the steps
whose time is reported.
"""
from __future__ import annotations

import torch

from flashwatt.models.attention import current_function, register

TIMED_NAME = "fw_timed"  # no "flash" in it: attention.registered_name says why


class _GradientArrives(torch.autograd.Function):
    @staticmethod
    def forward(ctx, timer, out):
        ctx.timer = timer
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.timer._backward_started()
        return None, grad


class _GradientLeaves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, timer, q, k, v):
        ctx.timer = timer
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        ctx.timer._backward_ended()
        return None, dq, dk, dv


class AttentionTimer:
    """Install with `attach(model)`, run steps, read `take()` after each; `detach()` restores."""

    def __init__(self):
        self._spans: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._open: torch.cuda.Event | None = None
        self._previous: str | None = None
        self.calls = 0

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _backward_started(self) -> None:
        self._open = self._event()

    def _backward_ended(self) -> None:
        if self._open is not None:
            self._spans.append(("backward", self._open, self._event()))
            self._open = None

    def attach(self, model) -> None:
        function, mask = current_function(model)
        self._previous = model.config._attn_implementation

        def timed(module, query, key, value, *args, **kwargs):
            grad = torch.is_grad_enabled() and query.requires_grad
            if grad:
                query, key, value = _GradientLeaves.apply(self, query, key, value)
            start = self._event()
            out, weights = function(module, query, key, value, *args, **kwargs)
            self._spans.append(("forward", start, self._event()))
            self.calls += 1
            if grad:
                out = _GradientArrives.apply(self, out)
            return out, weights

        model.set_attn_implementation(register(TIMED_NAME, timed, mask))

    def detach(self, model) -> None:
        if self._previous is not None:
            model.set_attn_implementation(self._previous)
            self._previous = None

    def take(self) -> dict[str, float]:
        """Milliseconds of attention forward and backward since the last take (synchronises)."""
        torch.cuda.synchronize()
        out = {"forward": 0.0, "backward": 0.0}
        for phase, start, end in self._spans:
            out[phase] += start.elapsed_time(end)
        self._spans.clear()
        return out
