"""What the controller may change: one `Configuration` per way of computing attention, or
of running a model's step.

Every knob is on the workload's side: the backend (and for our kernel its tile or CTA
cap), how a large call is split into chunks, and the precision when the user opts in. A
step (`Controller.step`) has its own: the attention backend inside the model (through the
backend registry), the batch split into micro-batches with gradient accumulation (the
`chunks` of a step), activation recompute on a share of the model's blocks, and the
precision when the user opts in. Pacing (the duty cycle) is a continuous knob of the loop,
not part of a configuration. Nothing here touches a device setting: no power limit, no
clocks.
"""
from __future__ import annotations

from dataclasses import dataclass

from flashwatt.kernels import registry
from flashwatt.vocabulary import TOLERANCE

# Backends the controller may choose among, in the order it tries them: those the backend
# registry lets it (flashwatt.kernels.registry's `control_order`). naive and sdpa_math are
# reference implementations, never a sensible choice for a live workload.
CONTROL_BACKENDS = registry.control_backend_names()

# The knobs a user may restrict (Controller(knobs={...})); anything else is refused by name.
# `micro_batches` and `recompute` are a step's (Controller.step), `variant` and `chunks` an
# attention call's.
KNOBS = ("backend", "variant", "chunks", "precision", "duty", "micro_batches", "recompute")
# A step whose model is not attached to the controller keeps its own attention: its
# configurations name this instead of a backend.
KEEP_BACKEND = "unchanged"
# Activation recompute: the share of a model's blocks (percent) whose activations are
# recomputed in the backward instead of kept.
RECOMPUTE_SHARES = (0, 50, 100)

# Precision steps the controller may take when the user opts in with a tolerance: from the
# inputs' precision towards cheaper arithmetic, never the other way. fp8 quantises 16-bit
# inputs in the call (flashwatt.kernels.custom_fp8); it is a step from nowhere else.
PRECISION_LADDER = {"fp32": ("tf32", "bf16", "fp16"), "tf32": ("bf16", "fp16"), "fp16": ("fp8",),
                    "bf16": ("fp8",), "fp8": ()}
# Steps offered only where the user's tolerance reaches the bound flashwatt's own check holds
# them to (vocabulary.TOLERANCE): fp8's error, about 5 % on N(0, 1) inputs, is an order of
# magnitude above the other steps', so a tolerance merely present does not invite it.
TOLERANCE_GATED = ("fp8",)

# Our kernel's CTA caps the controller tries (fractions of an H100/H200's 132 SMs at 1 CTA
# each): fewer CTAs in flight draw less power at a lower throughput.
DEFAULT_CTA_CAPS = (66, 33)


class ControlError(ValueError):
    """A controller setting that cannot work, worded for the person who gave it."""


@dataclass(frozen=True, order=True)
class Configuration:
    backend: str
    variant: str = ""  # our kernel's launch (tile and/or CTA cap), "" its default
    chunks: int = 1  # the batch split into this many sequential calls (a step's micro-batches)
    precision: str = ""  # "" runs the inputs' own precision; else the opted-in cheaper one
    recompute: int = 0  # a step's: percent of the model's blocks whose activations are recomputed

    def __post_init__(self) -> None:
        if self.backend not in CONTROL_BACKENDS and self.backend != KEEP_BACKEND:
            raise ControlError(f"backend {self.backend!r}: allowed {', '.join(CONTROL_BACKENDS)}")
        if self.variant and not registry.backend(self.backend).variants:
            raise ControlError(f"variant {self.variant!r} names a launch of our kernel; backend is {self.backend}")
        if not isinstance(self.chunks, int) or self.chunks < 1:
            raise ControlError(f"chunks={self.chunks!r}: must be a positive integer")
        if self.precision and self.precision not in PRECISION_LADDER:
            raise ControlError(f"precision {self.precision!r}: allowed {', '.join(PRECISION_LADDER)}")
        if self.recompute not in RECOMPUTE_SHARES:
            raise ControlError(f"recompute={self.recompute!r}: allowed {', '.join(map(str, RECOMPUTE_SHARES))} "
                               "(percent of the blocks)")

    @property
    def micro_batches(self) -> int:
        """A step's: the batch split into this many micro-batches, gradients accumulated."""
        return self.chunks

    @property
    def label(self) -> str:
        parts = [self.backend + (f"[{self.variant}]" if self.variant else "")]
        if self.chunks > 1:
            parts.append(f"x{self.chunks}")
        if self.recompute:
            parts.append(f"rc{self.recompute}")
        if self.precision:
            parts.append(self.precision)
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> "Configuration":
        """The inverse of `label` ("custom[ctas66] x2 tf32", "sdpa_cudnn x2 rc50"), for configs and traces."""
        words = text.split()
        if not words:
            raise ControlError("empty configuration")
        head, rest = words[0], words[1:]
        backend, _, variant = head.partition("[")
        variant = variant.rstrip("]")
        chunks, precision, recompute = 1, "", 0
        for word in rest:
            if word.startswith("x") and word[1:].isdigit():
                chunks = int(word[1:])
            elif word.startswith("rc") and word[2:].isdigit():
                recompute = int(word[2:])
            else:
                precision = word
        return cls(backend, variant, chunks, precision, recompute)


def check_knobs(knobs: dict | None) -> dict:
    """The user's knob restrictions, each a list of allowed values; unknown names refused."""
    knobs = dict(knobs or {})
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ControlError(f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    for name, values in knobs.items():
        if name == "duty":
            low, high = values
            if not 0 < low <= high <= 1:
                raise ControlError(f"knob duty: give (low, high) with 0 < low <= high <= 1, not {values!r}")
            continue
        if isinstance(values, (str, int)) or not values:
            raise ControlError(f"knob {name}: give a non-empty list of allowed values, not {values!r}")
    for backend in knobs.get("backend", ()):
        if backend not in CONTROL_BACKENDS and backend != KEEP_BACKEND:
            raise ControlError(f"knob backend: {backend!r} is not allowed; allowed: {', '.join(CONTROL_BACKENDS)}, "
                               f"or {KEEP_BACKEND!r} (a step's model keeps its own)")
    for count in knobs.get("micro_batches", ()):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ControlError(f"knob micro_batches: {count!r} is not a positive whole number")
    for share in knobs.get("recompute", ()):
        if share not in RECOMPUTE_SHARES:
            raise ControlError(f"knob recompute: {share!r} is not allowed; allowed: "
                               f"{', '.join(map(str, RECOMPUTE_SHARES))} (percent of the blocks)")
    return knobs


def step_allowed(step: str, tolerance: float | None) -> bool:
    """Whether a precision step may join the candidates at the user's tolerance (None: no
    tolerance given): every step but a TOLERANCE_GATED one, which needs a tolerance at least
    its bound."""
    return step not in TOLERANCE_GATED or (tolerance is not None and tolerance >= TOLERANCE[step]["fwd"])


def candidates(precision: str, knobs: dict | None = None, precision_opt_in: bool = False,
               cta_caps: tuple[int, ...] = DEFAULT_CTA_CAPS, tolerance: float | None = None) -> list[Configuration]:
    """The configurations the controller explores for inputs of this precision.

    Defaults: every GPU backend (custom at its default tile and at the CTA caps), one
    chunk, the inputs' own precision; cheaper precisions join only with the user's
    opt-in (and each must pass the sampled float64 check before it is used), fp8 only where
    `tolerance` (the user's, relative to float64) allows it (step_allowed).
    `sdpa_default` is PyTorch's own choice: the baseline, not a candidate unless named.
    """
    knobs = check_knobs(knobs)
    backends = [b for b in knobs.get("backend", [b for b in CONTROL_BACKENDS if b != "sdpa_default"]) if b != KEEP_BACKEND]
    variants = knobs.get("variant", ["", *(f"ctas{n}" for n in cta_caps)])
    chunk_counts = knobs.get("chunks", [1])
    precisions = [""]
    if precision_opt_in:
        ladder = PRECISION_LADDER.get(precision, ())
        precisions += [p for p in knobs.get("precision", ladder) if p in ladder and step_allowed(p, tolerance)]
    out = []
    for backend in backends:
        declared = registry.backend(backend)
        for variant in (variants if declared.variants else [""]):
            for chunks in chunk_counts:
                for prec in precisions:
                    if (prec or precision) not in declared.precisions:
                        continue  # e.g. fp32 or tf32 for a half-precision-only backend
                    out.append(Configuration(backend, variant, int(chunks), prec))
    if not out:
        raise ControlError(f"no configuration left for {precision} inputs with knobs {knobs}")
    return out


# A cheaper precision for a whole step, from the model's own (the rungs a step may take with
# the user's opt-in): tf32 matmuls for a float32 model, then autocast to bf16. Not fp16: a
# training step under fp16 autocast needs a gradient scaler, which is the user's loop's.
STEP_PRECISION_LADDER = {"fp32": ("tf32", "bf16"), "tf32": ("bf16",), "fp16": (), "bf16": ()}


def step_candidates(precision: str, knobs: dict | None = None, precision_opt_in: bool = False,
                    backends: tuple[str, ...] | None = None) -> list[Configuration]:
    """The configurations the controller explores for a model's step.

    `backends`: the registry backends the attached model can take (None: the model is not
    attached, and the step keeps its own attention). Defaults: those backends (the user's
    `backend` knob restricts them), one micro-batch, no recompute, the model's own
    precision; micro-batches and recompute join only where the user's knobs allow them,
    cheaper precisions only with the opt-in (each checked before it is used).
    """
    knobs = check_knobs(knobs)
    if backends is None:
        names = [KEEP_BACKEND]
    else:
        names = [b for b in knobs.get("backend", backends) if b in backends or b == KEEP_BACKEND]
        if not names:
            raise ControlError(f"knob backend {knobs.get('backend')}: none of them plugs into this model "
                               f"(it takes {', '.join(backends)})")
    precisions = [""]
    if precision_opt_in:
        ladder = STEP_PRECISION_LADDER.get(precision, ())
        precisions += [p for p in knobs.get("precision", ladder) if p in ladder]
    return [Configuration(backend, "", int(chunks), prec, int(share)) for backend in names
            for chunks in knobs.get("micro_batches", [1]) for share in knobs.get("recompute", [0])
            for prec in precisions]
