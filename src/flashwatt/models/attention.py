"""Plugging an attention backend into a transformers model.

transformers 5 calls `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` in every
attention layer, with q, k, v in (B, H, L, D), and builds the layer's mask with
`ALL_MASK_ATTENTION_FUNCTIONS[...]` under the same name. A function registered without
its mask function gets *no* causal mask and no error (transformers treats it as a
backend that needs none), so every name registered here registers both.

Backends (flashwatt.models.cell.MODEL_BACKENDS):
  eager          transformers' own eager attention (matmul, softmax, matmul): the naive baseline
  sdpa_default   transformers' own SDPA path, nothing forced: what a user gets by default
  the others     each backend of flashwatt's registry that plugs into a model
                 (flashwatt.kernels.registry), the backend forced: sdpa_flash, custom, ...

The registry's kernels take full, unpadded sequences with the default scale 1/sqrt(D),
which is what prefill and training on packed contexts give them; a padded batch, a
scale, attention dropout or a KV cache they cannot take is refused with the reason
(`UnsupportedCell`), never run as something else.
"""
from __future__ import annotations

import math
import sys
from typing import Callable

from flashwatt.kernels.base import UnsupportedCell
from flashwatt.kernels.call import AttentionCall
from flashwatt.models.cell import MODEL_BACKENDS, TRANSFORMERS_BACKENDS

BUILTIN = TRANSFORMERS_BACKENDS  # backend -> transformers' own implementation
REGISTRY = tuple(b for b in MODEL_BACKENDS if b not in BUILTIN)  # through flashwatt's backend registry
BACKENDS = MODEL_BACKENDS


class RegistryAttention:
    """One registry kernel as a transformers attention function (for one model's dtype)."""

    def __init__(self, kernel_name: str, precision: str, train: bool):
        from flashwatt.kernels import get_kernel

        self.kernel = get_kernel(kernel_name)
        self.precision = precision
        self.pass_ = "fwd_bwd" if train else "fwd"
        # Whether K/V went to the kernel expanded to Q's heads rather than with fewer (its own
        # GQA path): always for a backend declared without grouped-query attention, and for
        # one that refuses it when called (asked once, then always expanded).
        self.kv_expanded = False
        self._calls: dict[tuple, AttentionCall] = {}
        self._refusals: dict[tuple, str | None] = {}  # (call, device) -> the backend's reason, or None

    def attention_call(self, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool,
                       kv_heads: int) -> AttentionCall:
        key = (batch, heads, seq_len, head_dim, causal, kv_heads)
        if key not in self._calls:
            self._calls[key] = AttentionCall(precision=self.precision, seq_len=seq_len, batch=batch, heads=heads,
                                             head_dim=head_dim, causal=causal, pass_=self.pass_, kv_heads=kv_heads)
        return self._calls[key]

    def _run(self, query, key, value, call: AttentionCall):
        """The kernel on the call; `UnsupportedCell` with the backend's reason where it cannot
        run it on this device (asked once per call and device), never an error of its own."""
        where = (call, query.device)
        if where not in self._refusals:
            self._refusals[where] = self.kernel.supports(call, query.device)
        if self._refusals[where] is not None:
            raise UnsupportedCell(f"{self.kernel.name}: {self._refusals[where]}")
        return self.kernel(query, key, value, call)

    def __call__(self, module, query, key, value, attention_mask, scaling: float | None = None, dropout: float = 0.0,
                 is_causal: bool | None = None, **kwargs):
        query, key, value, causal = registry_inputs(self.kernel.name, module, query, key, value, attention_mask,
                                                    scaling, dropout, is_causal)
        B, H, Lq, D = query.shape
        if key.shape[1] != H and (self.kv_expanded or not self.kernel.declaration.grouped_query):
            self.kv_expanded = True
            key, value = _expand(key, H), _expand(value, H)
        try:
            out = self._run(query, key, value, self.attention_call(B, H, Lq, D, causal, key.shape[1]))
        except UnsupportedCell:
            if key.shape[1] == H:
                raise
            self.kv_expanded = True
            out = self._run(query, _expand(key, H), _expand(value, H), self.attention_call(B, H, Lq, D, causal, H))
        return out.transpose(1, 2), None


def registry_inputs(name: str, module, query, key, value, attention_mask, scaling: float | None, dropout: float,
                    is_causal: bool | None):
    """What a registry kernel (or the controller choosing among them) is given for one
    transformers attention call: (q, k, v, causal), or `UnsupportedCell` saying why the
    call is not one such a kernel computes."""
    if attention_mask is not None:
        raise UnsupportedCell(f"{name} takes unpadded sequences only (the model passed an attention mask)")
    if dropout and module.training:
        raise UnsupportedCell(f"{name} has no attention dropout (the model asks for p={dropout})")
    Lq, D = query.shape[2], query.shape[3]
    if scaling is not None and not math.isclose(scaling, D ** -0.5, rel_tol=1e-6):
        raise UnsupportedCell(f"{name} scales scores by 1/sqrt(head_dim) only (the model asks for {scaling:g})")
    if key.shape[2] != Lq:
        raise UnsupportedCell(f"{name} runs self-attention over the whole context only (no KV cache: "
                              f"{Lq} queries, {key.shape[2]} keys)")
    # Under autocast the kernel takes what SDPA would: every input in the autocast dtype
    # (RoPE leaves Llama's q and k in float32 beside a bfloat16 v).
    import torch

    if torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and Lq > 1
    return query, key, value, causal


def _expand(t, heads: int):
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, flash_attention_mask

    return AttentionInterface, AttentionMaskInterface, ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask


def unpadded_mask() -> Callable:
    """transformers' mask function for kernels that take unpadded sequences: None for an
    unpadded causal batch (the kernel's causal flag does the masking), the 2-D padding
    mask otherwise (which the adapters refuse)."""
    return _interfaces()[3]


def registered_name(backend: str) -> str:
    """The name a registry backend is registered under. transformers takes any name with
    "flash" in it for a request of the flash-attn package (or a hub kernel), so neither
    the project's name nor sdpa_flash's may appear in it."""
    return "fw_" + backend.replace("flash", "fa2")


def register(name: str, function: Callable, mask_function: Callable) -> str:
    """Register an attention function and its mask function under one name."""
    attention_interface, mask_interface, _, _ = _interfaces()
    attention_interface.register(name, function)
    mask_interface.register(name, mask_function)
    return name


def use_backend(model, backend: str, precision: str, train: bool) -> RegistryAttention | None:
    """Switch `model` to `backend`; the registry adapter it runs (None for a built-in)."""
    if backend in BUILTIN:
        model.set_attn_implementation(BUILTIN[backend])
        return None
    if backend not in REGISTRY:
        raise ValueError(f"unknown model backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    adapter = RegistryAttention(backend, precision, train)
    model.set_attn_implementation(register(registered_name(backend), adapter, unpadded_mask()))
    return adapter


def current_function(model) -> tuple[Callable, Callable]:
    """The attention function and mask function the model runs now."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _, _, masks, _ = _interfaces()
    impl = model.config._attn_implementation
    if impl == "eager":
        # eager is each model's own function, in its modeling module, not in the interface
        layer = next(m for m in model.modules() if hasattr(m, "is_causal") and hasattr(m, "layer_idx"))
        return sys.modules[type(layer).__module__].eager_attention_forward, masks["eager"]
    return ALL_ATTENTION_FUNCTIONS[impl], masks[impl]
