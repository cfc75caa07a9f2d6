"""A distributed cell: one sequence-parallel attention problem on `gpus` GPUs, the single
source of its names and paths, as `flashwatt.attention.cell.Cell` is for one-GPU cells.

    results/cells/<suite>/distributed/<strategy>-<block>/<precision>/G<gpus>-L<L>-B<B>-H<H>-K<Hkv>-D<D>-<mask>-<pass>.json
    ... G<gpus>-N<nodes>-L<L>-...  for a cell over several nodes (gpus in all, gpus / nodes on each)

`DistributedCell.from_path(cell.path) == cell` holds, so asking for a file reruns exactly
that cell. `spec` is what `flashwatt.distributed.job.job` runs on every rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flashwatt.cell_files import CellFiles, file_patterns
from flashwatt.kernels.registry import block_names

STRATEGIES = ("ring", "zigzag", "ulysses", "hybrid")
# The block each registry backend computes with under a strategy (flashwatt.kernels.registry).
BLOCKS = block_names()
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16")  # fp64: the CPU checks (block math)


def refusal_without_cuda(precision: str) -> str | None:
    """Why a cell of this precision is skipped where no CUDA device is visible (CPU
    processes run the fp64 checks only), or None."""
    if precision != "fp64":
        return f"no CUDA device for a {precision} cell (CPU runs take precision fp64)"
    return None
PASSES = ("fwd", "fwd_bwd")

FOLDER = "distributed"
_WHERE = "/{suite}/" + FOLDER + "/{method}/{dprecision}/{dname}"
RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns(_WHERE)

_METHOD_RE = f"(?P<strategy>{'|'.join(STRATEGIES)})-(?P<block>{'|'.join(BLOCKS)})"
_NAME_RE = (r"G(?P<gpus>\d+)(?:-N(?P<nodes>\d+))?-L(?P<seq_len>\d+)-B(?P<batch>\d+)-H(?P<heads>\d+)-K(?P<kv_heads>\d+)"
            r"-D(?P<head_dim>\d+)-(?P<mask>full|causal)-(?P<pass_>fwd_bwd|fwd)")
_METHOD, _NAME = re.compile(f"^{_METHOD_RE}$"), re.compile(f"^{_NAME_RE}$")
_TOKEN = re.compile("^[a-z0-9_]+$")
WILDCARD_CONSTRAINTS = {
    "method": re.sub(r"\?P<\w+>", "", _METHOD_RE),
    "dprecision": "|".join(PRECISIONS),
    "dname": re.sub(r"\?P<\w+>", "", _NAME_RE),
}


@dataclass(frozen=True, order=True)
class DistributedCell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    strategy: str
    block: str
    precision: str
    gpus: int
    seq_len: int
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool = False
    pass_: str = "fwd"
    nodes: int = 1

    def __post_init__(self) -> None:
        def refuse(what: str) -> None:
            raise ValueError(f"distributed cell {what}")

        if not _TOKEN.match(self.suite):
            refuse(f"suite={self.suite!r}: use lower-case letters, digits, _")
        for key, allowed in (("strategy", STRATEGIES), ("block", BLOCKS), ("precision", PRECISIONS),
                             ("pass_", PASSES)):
            if getattr(self, key) not in allowed:
                refuse(f"{key.rstrip('_')}={getattr(self, key)!r}: allowed {', '.join(allowed)}")
        for key in ("gpus", "seq_len", "batch", "heads", "kv_heads", "head_dim", "nodes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                refuse(f"{key}={value!r}: must be a positive integer")
        if self.gpus % self.nodes:
            refuse(f"gpus={self.gpus} cannot be split evenly over nodes={self.nodes}")
        if self.nodes > 1 and self.strategy == "hybrid" and self.heads % (self.gpus // self.nodes):
            refuse(f"strategy hybrid over {self.nodes} nodes: its Ulysses all-to-all inside a node "
                   f"({self.gpus // self.nodes} GPUs) needs heads ({self.heads}) divisible by it")
        if self.heads % self.kv_heads:
            refuse(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.strategy in ("ring", "zigzag", "hybrid") and self.seq_len % (2 * self.gpus):
            refuse(f"seq_len={self.seq_len} is not divisible by 2 x world size ({2 * self.gpus}) for strategy "
                   f"{self.strategy}")
        if self.strategy == "ulysses" and (self.heads % self.gpus or self.seq_len % self.gpus):
            refuse(f"strategy ulysses needs heads ({self.heads}) and seq_len ({self.seq_len}) divisible by the "
                   f"world size ({self.gpus})")

    # ---- names -------------------------------------------------------------------
    @property
    def method(self) -> str:
        return f"{self.strategy}-{self.block}"

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        nodes = f"-N{self.nodes}" if self.nodes > 1 else ""
        return (f"G{self.gpus}{nodes}-L{self.seq_len}-B{self.batch}-H{self.heads}-K{self.kv_heads}-D{self.head_dim}"
                f"-{mask}-{self.pass_}")

    @property
    def id(self) -> str:
        return f"{self.suite}/{FOLDER}/{self.method}/{self.precision}/{self.name}"

    @property
    def wildcards(self) -> dict[str, str]:
        return {"suite": self.suite, "method": self.method, "dprecision": self.precision, "dname": self.name}

    @classmethod
    def from_wildcards(cls, suite: str, method: str, dprecision: str, dname: str) -> "DistributedCell":
        m, n = _METHOD.match(method), _NAME.match(dname)
        if not m:
            raise ValueError(f"not a distributed method: {method!r} (expected <strategy>-<block>, e.g. zigzag-flash)")
        if not n:
            raise ValueError(f"not a distributed cell name: {dname!r} (expected e.g. G2-L4096-B1-H32-K8-D128-causal-fwd)")
        g = n.groupdict()
        return cls(suite, m["strategy"], m["block"], dprecision, int(g["gpus"]), int(g["seq_len"]), int(g["batch"]),
                   int(g["heads"]), int(g["kv_heads"]), int(g["head_dim"]), g["mask"] == "causal", g["pass_"],
                   int(g["nodes"] or 1))


    # ---- what the job runs ----------------------------------------------------------
    def spec(self, **options) -> dict:
        """The job's spec (flashwatt.distributed.job), with options such as repeats and warmup."""
        return {"strategy": self.strategy, "gpus": self.gpus, "batch": self.batch, "heads": self.heads,
                "kv_heads": self.kv_heads, "seq_len": self.seq_len, "head_dim": self.head_dim,
                "precision": self.precision, "causal": self.causal, "pass": self.pass_, "block": self.block,
                **({"nodes": self.nodes} if self.nodes > 1 else {}), **options}

    def as_row(self) -> dict:
        return {"suite": self.suite, "strategy": self.strategy, "block": self.block, "precision": self.precision,
                "gpus": self.gpus, "seq_len": self.seq_len, "batch": self.batch, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "causal": self.causal, "pass": self.pass_,
                "nodes": self.nodes, "cell_id": self.id}
