"""The controller's attention calls: `Controller.attention(q, k, v, causal)`.

Each call runs the configuration the governor picks for its shape, through the kernel
registry (the backend, our kernel's tile or CTA cap, chunks of the batch, a cheaper
precision where the user opted in). A configuration the backend refuses for the shape is
forbidden for it and the next is tried. The call's GPU time is sampled with CUDA events
(the first three calls of each configuration synchronously, the very first dropped, then
one every `latency_every_s`), and the pacer (flashwatt.control.pacing) bounds the queue
and pays the idle time the duty owes.

Precision, only with `precision_tolerance`: a cheaper precision is used for a shape only
after a check against float64 on that call's own inputs stays within the tolerance; the
check repeats every `recheck_every` calls, and every verdict is in `checks()`.

A part of flashwatt.control.controller.Controller (a mixin): it reads the controller's
governor, pacer, device operations, lock and counters.
"""
from __future__ import annotations

import time

import torch

from flashwatt.attention.cell import Cell
from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.kernels import get_kernel
from flashwatt.kernels.base import UnsupportedCell
from flashwatt.measure import DTYPES, check_rows, reference_attention, relative_error
from flashwatt.vocabulary import STORED_AS

_PRECISION_OF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# Query rows of batch 0, head 0 compared with float64 by a precision check.
CHECK_ROWS = 256
# Calls timed synchronously when a configuration starts (the first is dropped: one-off costs).
SYNC_TIMED = 3


class AttentionCalls:
    """`Controller.attention` and what it needs (module docstring)."""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
        self._raise_fault()
        precision = _PRECISION_OF.get(q.dtype)
        if precision is None:
            raise ControlError(f"inputs of dtype {q.dtype}: the controller takes float16, bfloat16 or float32")
        shape = (tuple(q.shape), tuple(k.shape), bool(causal), precision)
        tokens = q.shape[0] * q.shape[2]
        for _ in range(16):  # each refusal removes a configuration; there are fewer than 16
            config = self.governor.config_for(shape)
            refusal = self._refusal(shape, config, q)
            if refusal is None and config.precision:
                refusal = self._precision_refusal(shape, config, q, k, v, causal)
            if refusal is not None:
                self.governor.forbid(shape, config, refusal)
                continue
            try:
                out = self._timed_call(shape, config, q, k, v, causal, tokens)
            except UnsupportedCell as err:
                self.governor.forbid(shape, config, str(err))
                continue
            break
        else:
            raise ControlError(f"no configuration could run shape {shape}")
        self._after_call(shape, config, tokens)
        return out

    def _cell(self, shape: tuple, config: Configuration) -> Cell:
        key = (shape, config)
        if key not in self._cells:
            (B, H, L, D), _, causal, precision = shape
            self._cells[key] = Cell("control", config.backend, config.precision or precision, L, max(1, B // config.chunks),
                                    H, D, causal, "fwd", config.variant)
        return self._cells[key]

    def _refusal(self, shape: tuple, config: Configuration, q: torch.Tensor) -> str | None:
        key = (shape, config)
        if key not in self._supported:
            if config.chunks > 1 and shape[0][0] % config.chunks:
                self._supported[key] = f"batch {shape[0][0]} does not split into {config.chunks} chunks"
            else:
                self._supported[key] = get_kernel(config.backend).supports(self._cell(shape, config), q.device)
        return self._supported[key]

    def _run(self, shape, config: Configuration, q, k, v, causal) -> torch.Tensor:
        cell = self._cell(shape, config)
        kernel = get_kernel(config.backend)
        if config.precision and config.precision not in STORED_AS:  # fp8 quantises the inputs it is given
            dtype = DTYPES[config.precision]
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if config.chunks == 1:
            out = kernel(q, k, v, cell)
        else:
            step = q.shape[0] // config.chunks
            out = torch.cat([kernel(q[i:i + step], k[i:i + step], v[i:i + step], cell)
                             for i in range(0, q.shape[0], step)])
        return out if not config.precision else out.to(DTYPES[shape[3]])

    def _timed_call(self, shape, config, q, k, v, causal, tokens) -> torch.Tensor:
        key = (shape, config)
        n = self._calls[key]
        now = time.perf_counter()
        if n < SYNC_TIMED:  # the first calls of a configuration, timed synchronously: the probe
            start = self._ops.stamp()
            out = self._run(shape, config, q, k, v, causal)
            end = self._ops.stamp()
            self._ops.wait(end)
            if n >= 1:
                self.governor.on_latency(shape, config, self._ops.seconds(start, end), tokens)
        elif now - self._last_latency_t >= self.latency_every_s:
            self._last_latency_t = now
            start = self._ops.stamp()
            out = self._run(shape, config, q, k, v, causal)
            end = self._ops.stamp()
            with self._lock:
                self._pending.append((shape, config, tokens, start, end, 0.0))
        else:
            out = self._run(shape, config, q, k, v, causal)
        self._calls[key] = n + 1
        return out

    def _after_call(self, shape: tuple, config: Configuration, tokens: int) -> None:
        with self._lock:
            self._work.add(shape, config, tokens)
        self.calls += 1
        self.tokens += tokens
        stats = self.governor.model.stats.get((shape, config))
        gpu_s = stats.s_per_call if stats and stats.s_per_call else 0.0
        self._pacer.after_call(gpu_s)

    # ---- precision -----------------------------------------------------------------------
    def _precision_refusal(self, shape, config, q, k, v, causal) -> str | None:
        key = (shape, config)
        n = self._calls[key]
        if n % self.recheck_every:
            return None
        out = self._run(shape, config, q[:1], k[:1], v[:1], causal)
        rows = check_rows(q.shape[2], CHECK_ROWS)
        with torch.no_grad():
            ref = reference_attention(q[0, :1], k[0, :1], v[0, :1], causal, rows)
            err = relative_error(out[0, :1][:, rows.to(out.device)], ref)
        ok = err <= self.precision_tolerance  # NaN never passes
        self._checks.append({"t": time.monotonic(), "config": config.label, "shape": str(shape), "call": n,
                             "rel_err": err, "tolerance": self.precision_tolerance, "passed": ok})
        if ok:
            return None
        return f"precision check failed: rel_err {err:.3g} > tolerance {self.precision_tolerance:g}"
