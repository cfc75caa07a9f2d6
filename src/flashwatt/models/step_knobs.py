"""A transformers model's knobs, as the controller's steps change them
(flashwatt.control.model_steps; `Controller.attach(model)` makes one):

- the attention backend: each backend of the registry that plugs into a model and that
  the controller may choose (flashwatt.kernels.registry), switched with
  flashwatt.models.attention.use_backend;
- activation recompute on a share of the decoder blocks (flashwatt.models.recompute: a
  share of 50 checkpoints every other block, 100 all of them, the blocks a model cell's
  `recompute` share names);
- pacing points: a hook where each decoder block begins, forward and backward;
- the probe a cheaper precision is checked by: the model's logits on a fixed short batch.
"""
from __future__ import annotations

import torch

from flashwatt.control.configuration import KEEP_BACKEND, Configuration
from flashwatt.models.recompute import checkpoint_blocks, enable_recompute

_PRECISION_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Tokens of the precision probe's fixed batch (one sequence).
PROBE_TOKENS = 128


class ModelKnobs:
    def __init__(self, model, precision: str | None = None, train: bool | None = None):
        from flashwatt.models.fsdp import decoder_blocks

        self.model = model
        dtype = next(model.parameters()).dtype
        self.precision = precision or _PRECISION_OF.get(dtype, "fp32")
        self.train = model.training if train is None else bool(train)
        self.blocks = decoder_blocks(model)
        parameters = sum(p.numel() for p in model.parameters())
        self.signature = f"{type(model).__name__}-{parameters}-{self.precision}-{'train' if self.train else 'eval'}"
        self.backend = None  # the backend switched to last (None: the model's own until then)
        self.recompute = 0
        self._checkpointing_ready = False
        self._probe_tokens: torch.Tensor | None = None

    def backends(self) -> tuple[str, ...]:
        """The registry backends the controller may give this model's attention."""
        from flashwatt.control.configuration import CONTROL_BACKENDS
        from flashwatt.kernels import registry

        return tuple(b for b in CONTROL_BACKENDS if registry.backend(b).in_models)

    def refusal(self, config: Configuration) -> str | None:
        if config.recompute and not self.train:
            return f"{config.label}: activation recompute applies to training steps (the model is in eval mode)"
        return None

    def apply(self, config: Configuration) -> None:
        from flashwatt.models.attention import use_backend

        if config.backend != KEEP_BACKEND and config.backend != self.backend:
            use_backend(self.model, config.backend, self.precision, self.train)
            self.backend = config.backend
        if config.recompute != self.recompute:
            self._set_recompute(config.recompute)

    def _set_recompute(self, share: int) -> None:
        if share and not self._checkpointing_ready:
            enable_recompute(self.model, share)  # transformers' checkpoint function, then the share's flags
            self._checkpointing_ready = True
        else:
            checkpoint_blocks(self.blocks, share)
        self.recompute = share

    def pacing_hooks(self, pace) -> list:
        """A pacing point where each block begins, forward and backward; the hooks' handles."""
        handles = []
        for block in self.blocks:
            handles.append(block.register_forward_pre_hook(lambda module, args: pace()))
            handles.append(block.register_full_backward_pre_hook(lambda module, grad_output: pace()))
        return handles

    def probe(self) -> torch.Tensor:
        """The model's logits on a fixed batch of PROBE_TOKENS tokens (no gradient, eval mode,
        the training mode restored after)."""
        device = next(self.model.parameters()).device
        if self._probe_tokens is None:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            generator = torch.Generator(device="cpu").manual_seed(0)
            self._probe_tokens = torch.randint(0, vocab, (1, PROBE_TOKENS), generator=generator).to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self.model(input_ids=self._probe_tokens, use_cache=False).logits.float()
        finally:
            self.model.train(was_training)

    def after_failure(self) -> None:
        """A step failed part-way: the gradients it left are not the next step's."""
        if self.train:
            self.model.zero_grad(set_to_none=True)
