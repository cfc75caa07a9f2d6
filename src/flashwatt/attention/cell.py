"""A cell: one measurement, the single source every name and path is derived from.

Snakemake wildcards, output paths, submitit job names, log files and summary rows all
come from `Cell`; nothing else assembles them. `Cell.from_path(cell.path) == cell`
holds for every valid cell, which is what lets `snakemake -f <file>` rerun exactly one.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from flashwatt.cell_files import CellFiles, file_patterns
from flashwatt.flop_count import attention_flops
from flashwatt.vocabulary import KERNEL_NAMES, PASSES, PRECISIONS
# Every file of a cell, as Snakemake patterns over the cell's wildcards.
RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns("/{suite}/{kernel}/{precision}/{name}")
_TOKEN_RE = "[a-z0-9_]+"
# Name segment of a cell inside results/cells/<suite>/<kernel>/<precision>/.
_NAME_RE = (
    r"L(?P<seq_len>\d+)-B(?P<batch>\d+)-H(?P<heads>\d+)-D(?P<head_dim>\d+)"
    r"-(?P<mask>full|causal)-(?P<pass_>fwd_bwd|fwd)(?:-(?P<variant>" + _TOKEN_RE + "))?"
)
_NAME = re.compile(f"^{_NAME_RE}$")
# What each wildcard may match, so that Snakemake never mistakes one file for another
# (the name pattern above, without its group names).
WILDCARD_CONSTRAINTS = {
    "suite": _TOKEN_RE,
    "kernel": _TOKEN_RE,
    "precision": "|".join(PRECISIONS),
    "name": re.sub(r"\?P<\w+>", "", _NAME_RE),
}
_TOKEN = re.compile(f"^{_TOKEN_RE}$")


@dataclass(frozen=True, order=True)
class Cell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    kernel: str
    precision: str
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    causal: bool = False
    pass_: str = "fwd"
    variant: str = ""  # kernel option, e.g. a tile configuration of the custom kernel

    def __post_init__(self) -> None:
        for key in ("suite", "kernel"):
            if not _TOKEN.match(getattr(self, key)):
                raise ValueError(f"cell {key}={getattr(self, key)!r}: use lower-case letters, digits, _")
        if self.variant and not _TOKEN.match(self.variant):
            raise ValueError(f"cell variant={self.variant!r}: use lower-case letters, digits, _")
        if self.kernel not in KERNEL_NAMES:
            raise ValueError(f"cell kernel={self.kernel!r}: allowed {', '.join(KERNEL_NAMES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"cell precision={self.precision!r}: allowed {', '.join(PRECISIONS)}")
        if self.pass_ not in PASSES:
            raise ValueError(f"cell pass={self.pass_!r}: allowed {', '.join(PASSES)}")
        for key in ("seq_len", "batch", "heads", "head_dim"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"cell {key}={value!r}: must be a positive integer")

    # ---- names -------------------------------------------------------------------
    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        base = f"L{self.seq_len}-B{self.batch}-H{self.heads}-D{self.head_dim}-{mask}-{self.pass_}"
        return f"{base}-{self.variant}" if self.variant else base

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.kernel}/{self.precision}/{self.name}"

    @property
    def wildcards(self) -> dict[str, str]:
        return {"suite": self.suite, "kernel": self.kernel, "precision": self.precision, "name": self.name}

    @classmethod
    def from_wildcards(cls, suite: str, kernel: str, precision: str, name: str) -> "Cell":
        match = _NAME.match(name)
        if not match:
            raise ValueError(f"not a cell name: {name!r} (expected e.g. L1024-B16-H8-D64-full-fwd)")
        g = match.groupdict()
        return cls(
            suite=suite,
            kernel=kernel,
            precision=precision,
            seq_len=int(g["seq_len"]),
            batch=int(g["batch"]),
            heads=int(g["heads"]),
            head_dim=int(g["head_dim"]),
            causal=g["mask"] == "causal",
            pass_=g["pass_"],
            variant=g["variant"] or "",
        )


    # ---- arithmetic --------------------------------------------------------------
    @property
    def fwd_flops(self) -> float:
        """FLOPs of this cell's forward (flashwatt.flop_count: 4·B·H·L²·D, halved for causal)."""
        return attention_flops(self.batch, self.heads, self.seq_len, self.head_dim, self.causal)

    @property
    def flops(self) -> float:
        """FLOPs of one call of this cell's pass: backward counts 2.5x forward."""
        return attention_flops(self.batch, self.heads, self.seq_len, self.head_dim, self.causal, self.pass_)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def as_row(self) -> dict:
        """Flat dict for records and summary tables (`pass` spelled as users read it)."""
        row = dataclasses.asdict(self)
        row["pass"] = row.pop("pass_")
        row["cell_id"] = self.id
        return row
