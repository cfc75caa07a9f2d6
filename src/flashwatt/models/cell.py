"""A model cell: one step of a whole model (prefill or a training step) with one attention
backend, on one GPU or several, the single source of its names and paths.

    results/cells/<suite>/model/<model>/<backend>/<precision>/<phase>-L<L>-B<B>[-recompute[<p>]][-compiled][-G<gpus>-<strategy>][-gov-<governor>].json

`recompute` is the percent of the decoder blocks whose activations a training step
recomputes (flashwatt.models.recompute): 0 (false) names nothing, 100 (true) `-recompute`
as it always did, a share p of 1-99 `-recompute<p>` (`-recompute50`: every other block).

A one-GPU cell has strategy `none` and no suffix (the names one-GPU cells always had);
a cell on several GPUs names its world size and strategy: `fsdp` (data parallel, FSDP2,
B sequences per GPU) or a context-parallel strategy (`ring`, `zigzag`, `ulysses`,
`hybrid`: B sequences, each split over the GPUs). `ModelCell.from_path(cell.path) == cell`
holds, so asking for a file reruns that cell.

A cell with a `governor` runs its steps under the step-level controller
(flashwatt.control.governor_setting: `budget450w`, `budget600w-400w_at20s`, `energy`,
`budget450w-limit83c`) for the suite's seconds, starting from its backend, or, with
`front`, runs the static front of (backend x pacing x micro-batch) it is judged against.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flashwatt.cell_files import CellFiles, file_patterns
from flashwatt.control.governor_setting import GOVERNOR_RE, GovernorSetting
from flashwatt.kernels.registry import model_backend_names
from flashwatt.models.recompute import ALL, recompute_percent

# Backends transformers implements itself, by the name a model cell gives them, and the
# name transformers knows each by: its eager attention (matmul, softmax, matmul: the naive
# baseline) and its SDPA path with nothing forced (PyTorch's own choice, as the registry's
# sdpa_default).
TRANSFORMERS_BACKENDS = {"eager": "eager", "sdpa_default": "sdpa"}
# transformers' own, then every registry backend that plugs into a model
# (flashwatt.kernels.registry), each run through flashwatt.models.attention.
MODEL_BACKENDS = (*TRANSFORMERS_BACKENDS, *(b for b in model_backend_names() if b not in TRANSFORMERS_BACKENDS))
# The power-aware controller (flashwatt.control) choosing every attention call's
# configuration among the registry's GPU backends: `control_energy` minimises joules per
# token, `control_<W>w` holds a budget of W watts.
CONTROL_BACKEND_RE = r"control_(?:energy|[1-9]\d*w)"
# Storage and arithmetic of the whole model: weights, activations, gradients and AdamW's
# states all in this dtype (pure half-precision training, as the anchors measured).
MODEL_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
PHASES = ("prefill", "train", "decode")


def refusal_without_cuda(cell: "ModelCell") -> str | None:
    """The first reason a model cell gives where no CUDA device is visible: a precision
    other than fp32 (flashwatt.models.preflight asks this first), or None."""
    if cell.precision != "fp32":
        return f"on CPU the models run fp32 only (cell asks for {cell.precision})"
    return None
# flashwatt.models.parallel.STRATEGIES, with `none` for one GPU (a test checks they agree)
MODEL_STRATEGIES = ("none", "fsdp", "ring", "zigzag", "ulysses", "hybrid")
CONTEXT_PARALLEL = ("ring", "zigzag", "ulysses", "hybrid")

FOLDER = "model"
_TOKEN_RE = "[a-z0-9_]+"
_WHERE = "/{suite}/" + FOLDER + "/{mmodel}/{mbackend}/{mprecision}/{mname}"
RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns(_WHERE)
_NAME_RE = (rf"(?P<phase>{'|'.join(PHASES)})-L(?P<seq_len>\d+)-B(?P<batch>\d+)"
            r"(?P<recompute>-recompute(?P<share>[1-9][0-9]?)?)?(?P<compiled>-compiled)?"
            rf"(?:-G(?P<gpus>\d+)-(?P<strategy>{'|'.join(MODEL_STRATEGIES[1:])}))?"
            rf"(?:-gov-(?P<governor>{GOVERNOR_RE}))?")
_NAME = re.compile(f"^{_NAME_RE}$")
_TOKEN = re.compile(f"^{_TOKEN_RE}$")
WILDCARD_CONSTRAINTS = {
    "mmodel": _TOKEN_RE,
    "mbackend": "|".join((*MODEL_BACKENDS, CONTROL_BACKEND_RE)),
    "mprecision": "|".join(MODEL_PRECISIONS),
    "mname": re.sub(r"\?P<\w+>", "", _NAME_RE),
}


@dataclass(frozen=True, order=True)
class ModelCell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    model: str
    backend: str
    precision: str
    phase: str
    seq_len: int
    batch: int
    recompute: int = 0       # activation checkpointing: percent of the blocks whose forward is rerun in the backward
    compiled: bool = False   # torch.compile of the model
    gpus: int = 1            # world size: one process per GPU
    strategy: str = "none"   # how the GPUs share the step (none on one GPU)
    governor: str = ""       # the step-level controller's setting (flashwatt.control.governor_setting), "" none

    def __post_init__(self) -> None:
        def refuse(what: str) -> None:
            raise ValueError(f"model cell {what}")

        try:  # true and false as the percent they mean (100, 0): equal cells have one name
            object.__setattr__(self, "recompute", recompute_percent(self.recompute))
        except ValueError as err:
            refuse(f"recompute: {err}")
        for key in ("suite", "model"):
            if not _TOKEN.match(getattr(self, key)):
                refuse(f"{key}={getattr(self, key)!r}: use lower-case letters, digits, _")
        if self.backend not in MODEL_BACKENDS and not re.fullmatch(CONTROL_BACKEND_RE, self.backend):
            refuse(f"backend={self.backend!r}: allowed {', '.join(MODEL_BACKENDS)}, control_energy or "
                   "control_<watts>w (e.g. control_450w)")
        for key, allowed in (("precision", MODEL_PRECISIONS), ("phase", PHASES)):
            if getattr(self, key) not in allowed:
                refuse(f"{key}={getattr(self, key)!r}: allowed {', '.join(allowed)}")
        for key in ("seq_len", "batch", "gpus"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                refuse(f"{key}={value!r}: must be a positive integer")
        if self.recompute and self.phase != "train":
            refuse("recompute: activation checkpointing applies to train steps only")
        if self.strategy not in MODEL_STRATEGIES:
            refuse(f"strategy={self.strategy!r}: allowed {', '.join(MODEL_STRATEGIES)}")
        if (self.gpus == 1) != (self.strategy == "none"):
            refuse(f"strategy={self.strategy!r} with gpus={self.gpus}: one GPU takes strategy none, several GPUs "
                   f"one of {', '.join(MODEL_STRATEGIES[1:])}")
        if self.compiled and self.gpus > 1:
            refuse("compiled: torch.compile cells run on one GPU")
        if self.phase == "decode" and (self.compiled or self.gpus > 1):
            refuse("decode: a decode step runs on one GPU, uncompiled (its KV cache grows and is cut back every "
                   "step)")
        if self.control is not None and (self.gpus > 1 or self.compiled):
            refuse(f"backend {self.backend}: the controller reads one GPU's power and decides in Python at every "
                   "call, so it runs on one GPU and without torch.compile")
        if self.strategy in CONTEXT_PARALLEL and self.seq_len % (2 * self.gpus):
            refuse(f"seq_len={self.seq_len} is not divisible by 2 x world size ({2 * self.gpus}) for strategy "
                   f"{self.strategy}")
        if self.governor:
            try:
                GovernorSetting.parse(self.governor)
            except ValueError as err:
                refuse(f"governor={self.governor!r}: {err}")
            if self.control is not None:
                refuse(f"governor with backend {self.backend}: the step-level controller and the attention-level "
                       "one would both pace the GPU; give one")
        if self.strategy == "hybrid" and (self.gpus < 4 or self.gpus % 2):
            refuse(f"strategy hybrid runs a ring of 2 across Ulysses groups of gpus/2: it needs an even world size "
                   f"of at least 4 (gpus={self.gpus})")

    @property
    def name(self) -> str:
        return (f"{self.phase}-L{self.seq_len}-B{self.batch}" + self.recompute_suffix
                + ("-compiled" if self.compiled else "")
                + (f"-G{self.gpus}-{self.strategy}" if self.gpus > 1 else "")
                + (f"-gov-{self.governor}" if self.governor else ""))

    @property
    def recompute_suffix(self) -> str:
        """'' without recompute, '-recompute' for every block, '-recompute<p>' for a share."""
        if not self.recompute:
            return ""
        return "-recompute" if self.recompute == ALL else f"-recompute{self.recompute}"

    @property
    def control(self) -> tuple[str, float | None] | None:
        """(mode, budget watts) of a controller backend, None for a fixed one."""
        if not self.backend.startswith("control_"):
            return None
        setting = self.backend.removeprefix("control_")
        return ("energy", None) if setting == "energy" else ("budget", float(setting[:-1]))

    @property
    def global_batch(self) -> int:
        """Sequences per step over all GPUs: B per GPU under fsdp, B shared by all otherwise."""
        return self.batch * self.gpus if self.strategy == "fsdp" else self.batch

    @property
    def tokens(self) -> int:
        """Tokens per step, over all GPUs: a decode step makes one per sequence (L is its
        context), the other phases take L per sequence."""
        return self.global_batch * (1 if self.phase == "decode" else self.seq_len)

    @property
    def id(self) -> str:
        return f"{self.suite}/{FOLDER}/{self.model}/{self.backend}/{self.precision}/{self.name}"

    @property
    def wildcards(self) -> dict[str, str]:
        return {"suite": self.suite, "mmodel": self.model, "mbackend": self.backend, "mprecision": self.precision,
                "mname": self.name}

    @classmethod
    def from_wildcards(cls, suite: str, mmodel: str, mbackend: str, mprecision: str, mname: str) -> "ModelCell":
        match = _NAME.match(mname)
        if not match:
            raise ValueError(f"not a model cell name: {mname!r} (expected e.g. train-L4096-B2, "
                             "prefill-L8192-B1-compiled or train-L8192-B1-G4-zigzag)")
        g = match.groupdict()
        return cls(suite, mmodel, mbackend, mprecision, g["phase"], int(g["seq_len"]), int(g["batch"]),
                   int(g["share"] or ALL) if g["recompute"] else 0, bool(g["compiled"]), int(g["gpus"] or 1), g["strategy"] or "none",
                   g["governor"] or "")


    def as_row(self) -> dict:
        return {"suite": self.suite, "model": self.model, "backend": self.backend, "precision": self.precision,
                "phase": self.phase, "seq_len": self.seq_len, "batch": self.batch, "recompute": self.recompute,
                "compiled": self.compiled, "gpus": self.gpus, "strategy": self.strategy, "governor": self.governor,
                "global_batch": self.global_batch, "tokens": self.tokens, "cell_id": self.id}
