"""A training cell: one training run of a model to a token budget with one attention
backend, optimizer, schedule and seed; the single source of its names and paths.

    results/cells/<suite>/train/<model>/<backend>/<precision>/
        <optimizer>-<schedule>-lr<lr>-do<dropout>-wd<weight_decay>-B<batch>-L<context>-T<tokens>-s<seed>.json

A run under the step-level controller names its setting before the seed
(`...-T<tokens>-gov-budget450w-s<seed>`; flashwatt.control.governor_setting: a budget, a
schedule, energy mode, a temperature limit alongside a budget).

`TrainCell.from_path(cell.path) == cell` holds, so asking for a file reruns that run.
Numbers in the name are written with `format(x, "g")` (3e-4 -> 0.0003), which reads back
to the same float, so a learning rate of more than six significant digits is refused
rather than silently rounded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flashwatt.cell_files import CellFiles, file_patterns
from flashwatt.control.governor_setting import GOVERNOR_RE, GovernorSetting
from flashwatt.models.cell import MODEL_BACKENDS

# Mixed precision: weights, gradients and optimizer states in float32; the forward and
# backward under autocast to the cell's precision (fp16 with a gradient scaler). A
# convergence study in pure bf16 would measure bf16's rounding of small updates.
TRAIN_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def refusal_without_cuda(cell: "TrainCell") -> str | None:
    """The first reason a training cell gives where no CUDA device is visible: a precision
    other than fp32 (flashwatt.training.job asks this first), or None."""
    if cell.precision != "fp32":
        return f"on CPU the training cells run fp32 only (cell asks for {cell.precision})"
    return None
# flashwatt.training.optimizers.OPTIMIZERS and schedules.SCHEDULES (kept torch-free here;
# a test checks they agree)
TRAIN_OPTIMIZERS = ("adamw", "lion")
TRAIN_SCHEDULES = ("cosine", "wsd", "constant")

FOLDER = "train"
_TOKEN_RE = "[a-z0-9_]+"
_NUMBER_RE = r"[0-9.]+(?:e[-+]?[0-9]+)?"
_WHERE = "/{suite}/" + FOLDER + "/{tmodel}/{tbackend}/{tprecision}/{tname}"
RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns(_WHERE)
_NAME_RE = (rf"(?P<optimizer>{'|'.join(TRAIN_OPTIMIZERS)})-(?P<schedule>{'|'.join(TRAIN_SCHEDULES)})"
            rf"-lr(?P<lr>{_NUMBER_RE})-do(?P<dropout>{_NUMBER_RE})-wd(?P<weight_decay>{_NUMBER_RE})"
            r"-B(?P<batch>\d+)-L(?P<context>\d+)-T(?P<tokens>\d+)"
            rf"(?:-gov-(?P<governor>{GOVERNOR_RE}))?-s(?P<seed>\d+)")
_NAME = re.compile(f"^{_NAME_RE}$")
_TOKEN = re.compile(f"^{_TOKEN_RE}$")
WILDCARD_CONSTRAINTS = {
    "tmodel": _TOKEN_RE,
    "tbackend": "|".join(MODEL_BACKENDS),
    "tprecision": "|".join(TRAIN_PRECISIONS),
    "tname": re.sub(r"\?P<\w+>", "", _NAME_RE),
}


def number(x: float) -> str:
    return format(x, "g")


@dataclass(frozen=True, order=True)
class TrainCell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    model: str
    backend: str
    precision: str
    optimizer: str
    schedule: str
    lr: float            # peak learning rate
    dropout: float       # residual and embedding dropout (attention probabilities are never dropped)
    weight_decay: float  # decoupled, on the weight matrices only
    batch: int           # sequences per step
    context: int         # tokens per sequence
    tokens: int          # token budget: steps = tokens // (batch * context)
    seed: int            # weights, batches and dropout
    governor: str = ""   # the step-level controller's setting (flashwatt.control.governor_setting), "" none

    def __post_init__(self) -> None:
        def refuse(what: str) -> None:
            raise ValueError(f"training cell {what}")

        for key in ("suite", "model"):
            if not _TOKEN.match(getattr(self, key)):
                refuse(f"{key}={getattr(self, key)!r}: use lower-case letters, digits, _")
        for key, allowed in (("backend", MODEL_BACKENDS), ("precision", TRAIN_PRECISIONS),
                             ("optimizer", TRAIN_OPTIMIZERS), ("schedule", TRAIN_SCHEDULES)):
            if getattr(self, key) not in allowed:
                refuse(f"{key}={getattr(self, key)!r}: allowed {', '.join(allowed)}")
        for key in ("batch", "context", "tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                refuse(f"{key}={value!r}: must be a positive integer")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            refuse(f"seed={self.seed!r}: must be an integer >= 0")
        for key, low, high in (("lr", 0.0, None), ("dropout", 0.0, 1.0), ("weight_decay", 0.0, None)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                refuse(f"{key}={value!r}: must be a number")
            value = float(value)
            if value < low or (high is not None and value >= high) or (key == "lr" and value == 0.0):
                refuse(f"{key}={value!r}: must be " + ("> 0" if key == "lr" else f">= {low:g}")
                       + (f" and < {high:g}" if high is not None else ""))
            if float(number(value)) != value:
                refuse(f"{key}={value!r}: at most 6 significant digits (the file name holds {number(value)})")
            object.__setattr__(self, key, value)
        if self.governor:
            try:
                setting = GovernorSetting.parse(self.governor)
            except ValueError as err:
                refuse(f"governor={self.governor!r}: {err}")
            if setting.mode == "front":
                refuse("governor front: a training run is judged against a model cell's static front "
                       "(the models section's governors)")
        if self.tokens < self.batch * self.context:
            refuse(f"tokens={self.tokens}: the budget is smaller than one batch ({self.batch} x {self.context} "
                   f"= {self.batch * self.context} tokens)")

    @property
    def name(self) -> str:
        return (f"{self.optimizer}-{self.schedule}-lr{number(self.lr)}-do{number(self.dropout)}"
                f"-wd{number(self.weight_decay)}-B{self.batch}-L{self.context}-T{self.tokens}"
                + (f"-gov-{self.governor}" if self.governor else "") + f"-s{self.seed}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.context

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_step

    @property
    def setting(self) -> str:
        """The run without its seed: the runs the spread over seeds is taken across."""
        return self.id.rsplit("-s", 1)[0]

    @property
    def id(self) -> str:
        return f"{self.suite}/{FOLDER}/{self.model}/{self.backend}/{self.precision}/{self.name}"

    @property
    def wildcards(self) -> dict[str, str]:
        return {"suite": self.suite, "tmodel": self.model, "tbackend": self.backend, "tprecision": self.precision,
                "tname": self.name}

    @classmethod
    def from_wildcards(cls, suite: str, tmodel: str, tbackend: str, tprecision: str, tname: str) -> "TrainCell":
        match = _NAME.match(tname)
        if not match:
            raise ValueError(f"not a training cell name: {tname!r} "
                             "(expected e.g. adamw-cosine-lr0.001-do0-wd0.1-B32-L256-T4000000-s0)")
        g = match.groupdict()
        return cls(suite, tmodel, tbackend, tprecision, g["optimizer"], g["schedule"], float(g["lr"]),
                   float(g["dropout"]), float(g["weight_decay"]), int(g["batch"]), int(g["context"]),
                   int(g["tokens"]), int(g["seed"]), g["governor"] or "")


    def as_row(self) -> dict:
        return {"suite": self.suite, "model": self.model, "backend": self.backend, "precision": self.precision,
                "optimizer": self.optimizer, "schedule": self.schedule, "lr": self.lr, "dropout": self.dropout,
                "weight_decay": self.weight_decay, "batch": self.batch, "context": self.context,
                "token_budget": self.tokens, "seed": self.seed, "governor": self.governor, "steps": self.steps,
                "setting": self.setting,
                "cell_id": self.id}
