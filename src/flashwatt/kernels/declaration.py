"""What a backend's declaration says, and the rules that follow from it.

A `Backend` names an attention implementation, says what it supports and where its
implementation lives; `flashwatt.kernels.registry` declares every one of them. The
rules here answer "can it run this call?" from the declaration alone, torch-free,
before any tensor exists; `DeclaredKernel` puts an implementation behind them, so that
every caller of the registry gets the same answers, worded the same way.

Implementations are named by reference, "module:attribute", and imported on first use:
reading a declaration never imports torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flashwatt.kernels.call import AttentionCall


def load(reference: str) -> Any:
    """The object a "module:attribute" reference names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _joined(names) -> str:
    return "/".join(map(str, names))


@dataclass(frozen=True)
class Block:
    """A backend's form for the distributed strategies (flashwatt.distributed): attention of
    one query block against one key/value block that also returns the log-sum-exp of each
    query row, which the strategies need to merge partial results and to run the backward
    from the merged output (flashwatt.kernels.blocks says what a block computes)."""

    name: str  # what distributed cells call it: the <block> of results/.../distributed/<strategy>-<block>/
    implementation: str = ""  # "module:attribute" of its class, made with no arguments
    precisions: tuple[str, ...] = ()  # those it runs on a CUDA device (fp64: float64 inputs)
    cpu_precisions: tuple[str, ...] = ()  # those it runs on the CPU; none: CUDA only
    # A block that computes nothing itself: it runs the first of these blocks that takes the
    # inputs (their precision on their device), in this order.
    picks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Backend:
    """One attention backend: its name, what it supports, where it is implemented."""

    name: str  # what cells, configs and records call it
    # "module:attribute" of its kernel (flashwatt.kernels.base.Kernel): a class, made with
    # no arguments, or the kernel itself.
    implementation: str
    precisions: tuple[str, ...]  # cell precisions it runs on a CUDA device
    cpu_precisions: tuple[str, ...] = ()  # those it runs on the CPU; none: CUDA only
    head_dims: tuple[int, ...] | None = None  # None: whatever its implementation takes (it refuses the rest)
    causal: bool = True  # takes the causal mask (top-left aligned)
    grouped_query: bool = True  # takes K/V with fewer heads than Q itself; callers expand them for one that does not
    backward: bool = True  # has a backward pass (fwd_bwd cells, training)
    # Its backward is bit-identical run to run under torch.use_deterministic_algorithms(True)
    # (every forward is).
    deterministic: bool = True
    variants: bool = False  # takes a launch variant (flashwatt.kernels.custom's grammar of tiles and CTA caps)
    in_models: bool = True  # plugs into a model's attention layers (flashwatt.models.attention)
    # None: the power-aware controller (flashwatt.control) never chooses it; a number: it may,
    # and tries the backends it may choose in increasing order, starting from the first.
    control_order: int | None = None
    block: Block | None = None  # its (out, lse) form for distributed strategies, where it has one

    def refusal(self, call: "AttentionCall", device_type: str) -> str | None:
        """Why the declaration alone rules the call out on a device of this type, or None.
        `call` is an AttentionCall, or an attention Cell (the same fields)."""
        if device_type != "cuda" and not self.cpu_precisions:
            return f"{self.name} needs a CUDA device (running on {device_type})"
        if device_type != "cuda" and call.precision not in self.cpu_precisions:
            return f"{self.name} on CPU runs {_joined(self.cpu_precisions)} only (asked for {call.precision})"
        if device_type == "cuda" and call.precision not in self.precisions:
            return f"{self.name} runs {_joined(self.precisions)} only (asked for {call.precision})"
        if self.head_dims is not None and call.head_dim not in self.head_dims:
            return f"{self.name} takes head_dim {', '.join(map(str, self.head_dims))} (asked for {call.head_dim})"
        if call.causal and not self.causal:
            return f"{self.name} has no causal mask"
        if call.pass_ == "fwd_bwd" and not self.backward:
            return f"{self.name} has no backward pass"
        if call.variant and not self.variants:
            return f"{self.name} has no launch variants (asked for {call.variant!r})"
        return None

    def block_refusal(self, precision: str, device_type: str, head_dim: int | None = None) -> str | None:
        """Why this backend's own block (not one it picks) cannot take inputs of this
        precision and head dim on a device of this type, or None."""
        block = self.block
        if block is None:
            return f"{self.name} has no distributed block"
        if device_type != "cuda" and not block.cpu_precisions:
            return f"block {block.name!r} ({self.name}) needs a CUDA device (running on {device_type})"
        allowed = block.precisions if device_type == "cuda" else block.cpu_precisions
        if precision not in allowed:
            where = "" if device_type == "cuda" else " on CPU"
            return f"block {block.name!r} ({self.name}) runs {_joined(allowed)}{where} only (asked for {precision})"
        if head_dim is not None and self.head_dims is not None and head_dim not in self.head_dims:
            return (f"block {block.name!r} ({self.name}) takes head_dim {', '.join(map(str, self.head_dims))} "
                    f"(asked for {head_dim})")
        return None

    def kernel(self) -> "DeclaredKernel":
        """Its implementation behind the declaration's rules (imports it)."""
        found = load(self.implementation)
        return DeclaredKernel(self, found() if isinstance(found, type) else found)


class DeclaredKernel:
    """An implementation behind its backend's declaration: the contract of
    flashwatt.kernels.base.Kernel whatever the implementation defines itself. `supports`
    asks the declaration first, then the implementation's own `supports` where it has one
    (what only it can tell: a device's compute capability, a launch variant)."""

    __slots__ = ("declaration", "implementation", "name", "differentiable", "describe", "parts")

    def __init__(self, declaration: Backend, implementation: Any):
        self.declaration = declaration
        self.implementation = implementation
        self.name = declaration.name
        self.differentiable = declaration.backward
        # The record's facts about a run (flashwatt.attention.job.kernel_details); None: none.
        self.describe = getattr(implementation, "describe", None)
        # parts(call, inputs) -> {name: call(i)}: pieces of one call timed apart (an fp8 call's
        # quantisation and kernel, flashwatt.attention.job); None: a call is one piece.
        self.parts = getattr(implementation, "parts", None)

    def supports(self, call: "AttentionCall", device) -> str | None:
        reason = self.declaration.refusal(call, getattr(device, "type", str(device)))
        own = getattr(self.implementation, "supports", None)
        return own(call, device) if reason is None and own is not None else reason

    def __call__(self, q, k, v, call: "AttentionCall"):
        return self.implementation(q, k, v, call)
