"""A model step, built and timed: prefill (the forward of a full context, logits of the last
position only, as a server's prefill keeps), train (forward with the loss, backward,
optimizer step) or decode (one new token per sequence over a KV cache of the context),
each phase between CUDA events.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable

import torch

from flashwatt.kernels.base import UnsupportedCell
from flashwatt.models.recompute import enable_recompute

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def build_model(spec: dict, precision: str, device: torch.device, seed: int, dropout: float = 0.0,
                **overrides):
    """The model of a spec (flashwatt.models.presets.model_spec) on `device` in the cell's dtype:
    random weights drawn under `seed`, or the folder's weights when the spec is a path that has them.
    `dropout` and `overrides`: as flashwatt.models.presets.build_config takes them."""
    import transformers

    from flashwatt.models.presets import build_config

    config = build_config(spec, dropout, **overrides)
    dtype = DTYPES[precision]
    torch.manual_seed(seed)
    if "path" in spec and any(p.suffix in (".safetensors", ".bin") for p in Path(spec["path"]).iterdir()):
        model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], config=config, dtype=dtype,
                                                                  local_files_only=True).to(device)
    else:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def reference_factory(model, device: torch.device) -> Callable:
    """Builds the check's reference: the same weights in float32 (float64 on CPU)."""
    import transformers

    def build():
        dtype = torch.float64 if device.type == "cpu" else torch.float32
        with torch.device(device):
            reference = transformers.AutoModelForCausalLM.from_config(model.config, dtype=dtype)
        reference.load_state_dict(model.state_dict())
        return reference

    return build


def body_matmul_parameters(model) -> int:
    """Parameters of the weight matrices a token multiplies by in the blocks: every
    parameter of 2 or more dims but the embedding tables and the LM head."""
    skip = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            skip.add(id(module.weight))
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in skip)


def model_record(model, model_spec: dict) -> tuple[object, int, dict]:
    """(the model's shape, its body matmul parameters, the record's `model` entry)."""
    from flashwatt.models.presets import shape_of

    shape = shape_of(model.config)
    body = body_matmul_parameters(model)
    return shape, body, {"parameters": sum(p.numel() for p in model.parameters()), "body_matmul_parameters": body,
                         "shape": shape.__dict__,
                         "weights": model_spec["path"] if "path" in model_spec else "random (seeded)", "dropout": 0.0}


def random_tokens(vocab: int, batch: int, seq_len: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)


class StepClock:
    """CUDA events on a GPU, perf_counter on CPU; `mark()` then `spans()` in ms."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            out = [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        else:
            out = [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]
        self.marks = []
        return out


@dataclass
class Step:
    """One step of a phase; `run()` does it, `timed()` does it and returns its phases in ms."""
    model: torch.nn.Module
    forward: Callable  # the model or its compiled form
    tokens: torch.Tensor
    phase: str
    optimizer: torch.optim.Optimizer | None = None
    cache: object | None = None  # decode: the KV cache of the context, cut back to it every step
    next_tokens: torch.Tensor | None = None  # decode: the token each sequence feeds per step
    parts: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        self.parts = ("forward", "backward", "optimizer") if self.phase == "train" else ("forward",)

    def _go(self, clock: StepClock | None, micro_batches: int = 1) -> None:
        mark = clock.mark if clock else (lambda: None)
        mark()
        if self.phase == "prefill":
            with torch.no_grad():
                for part in self._parts(micro_batches):
                    self.forward(input_ids=part, use_cache=False, logits_to_keep=1)
            mark()
            return
        if self.phase == "decode":
            if micro_batches > 1:
                raise UnsupportedCell("a decode step does not split into micro-batches (its KV cache is one batch)")
            context = self.tokens.shape[1]
            with torch.no_grad():
                self.forward(input_ids=self.next_tokens, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1)
            mark()
            crop_cache(self.cache, context)  # every step sees the same context (outside the timing)
            return
        for part in self._parts(micro_batches):  # gradients accumulate over the micro-batches
            loss = self.forward(input_ids=part, labels=part, use_cache=False).loss
            if micro_batches == 1:
                mark()
            (loss / micro_batches).backward()
            if micro_batches == 1:
                mark()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mark()

    def _parts(self, micro_batches: int) -> tuple[torch.Tensor, ...]:
        """The step's batch as `micro_batches` equal parts (the step's loss is their mean)."""
        if micro_batches == 1:
            return (self.tokens,)
        if self.tokens.shape[0] % micro_batches:
            raise UnsupportedCell(f"batch {self.tokens.shape[0]} does not split into {micro_batches} micro-batches")
        return self.tokens.chunk(micro_batches)

    def run(self, plan=None) -> None:
        """One step; `plan` (a controller's configuration) may split it into micro-batches."""
        self._go(None, plan.micro_batches if plan is not None else 1)

    def timed(self, clock: StepClock) -> dict[str, float]:
        self._go(clock)
        spans = clock.spans()
        return dict(zip(self.parts, spans)) | {"step": sum(spans)}


def crop_cache(cache, length: int) -> None:
    """Cut a transformers DynamicCache back to its first `length` tokens. A negative
    argument removes that many tokens both where `crop` takes a maximum length (older
    transformers 5 releases) and where it takes the tokens to remove (newer ones)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def fill_cache(model, tokens: torch.Tensor):
    """The KV cache of `tokens`, filled by a prefill under PyTorch's SDPA whatever the cell's
    backend (restored afterwards): a decode cell measures the steps after the context, and
    eager attention's prefill holds a batch x heads x L x L score matrix (32 GiB for
    Llama-3-8B at 32 x 4096) that the decode steps never need."""
    from flashwatt.models.attention import BUILTIN

    backend = model.config._attn_implementation
    model.set_attn_implementation(BUILTIN["sdpa_default"])
    try:
        with torch.no_grad():
            return model(input_ids=tokens, use_cache=True, logits_to_keep=1).past_key_values
    finally:
        model.set_attn_implementation(backend)


def make_step(model, cell, device: torch.device, seed: int, lr: float = 1e-5, weight_decay: float = 0.1) -> Step:
    """The cell's step: its tokens, its optimizer (AdamW, fused on a GPU) and its compiled
    forward when the cell asks for torch.compile. A decode step's KV cache is filled here,
    by a prefill of the context (`fill_cache`; transformers' DynamicCache, what `generate`
    uses by default: each step appends its token's keys and values, and the step cuts them
    off again)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    tokens = random_tokens(vocab, cell.batch, cell.seq_len, seed + 1, device)
    if cell.phase == "decode":
        model.eval()
        cache = fill_cache(model, tokens)
        next_tokens = random_tokens(vocab, cell.batch, 1, seed + 2, device)
        return Step(model, model, tokens, cell.phase, cache=cache, next_tokens=next_tokens)
    optimizer = None
    if cell.phase == "train":
        model.train()
        if cell.recompute:
            enable_recompute(model, cell.recompute)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                                      fused=device.type == "cuda")
    else:
        model.eval()
    forward = torch.compile(model) if cell.compiled else model
    return Step(model, forward, tokens, cell.phase, optimizer)


def warm_up(step, device: torch.device, count: int) -> list[float]:
    """`count` untimed steps (a compile among them), each waited for; their seconds. The
    peak-memory counter starts over first, so the cell's peak is its steps' own."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(count):
        t = time.perf_counter()
        step.run()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    return seconds


def time_steps(step: Step, device: torch.device, count: int) -> dict:
    """Median milliseconds of each phase over `count` steps, and every step's total."""
    clock = StepClock(device)
    runs = [step.timed(clock) for _ in range(count)]
    out = {f"{part}_ms": statistics.median(r[part] for r in runs) for part in (*step.parts, "step")}
    out["steps_ms"] = [r["step"] for r in runs]
    out["method"] = "CUDA events around each phase, median of steps" if device.type == "cuda" else \
        "perf_counter around each phase (CPU), median of steps"
    return out
