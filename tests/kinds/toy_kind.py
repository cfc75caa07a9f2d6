"""A kind of cell that flashwatt does not ship: summing 0..n-1 on the CPU. It exists to show
that a kind is defined in one place: named in FLASHWATT_KINDS, it is planned, validated,
run through submitit, tabled, drawn and counted with no edit to flashwatt."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from flashwatt.cell_files import CellFiles, file_patterns
from flashwatt.figure_base import FigureSpec, parquet_table
from flashwatt.job_frame import Job, run_in_frame
from flashwatt.kind import Kind, TableFile

RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = file_patterns("/{suite}/toy/{toyname}")
WILDCARD_CONSTRAINTS = {"toyname": r"n\d+"}


@dataclass(frozen=True, order=True)
class ToyCell(CellFiles):
    RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN = RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN
    WILDCARD_CONSTRAINTS = WILDCARD_CONSTRAINTS

    suite: str
    n: int

    @property
    def id(self) -> str:
        return f"{self.suite}/toy/n{self.n}"

    @property
    def wildcards(self) -> dict:
        return {"suite": self.suite, "toyname": f"n{self.n}"}

    @classmethod
    def from_wildcards(cls, suite: str, toyname: str) -> "ToyCell":
        match = re.fullmatch(r"n(\d+)", toyname)
        if not match:
            raise ValueError(f"not a toy cell name: {toyname!r}")
        return cls(suite, int(match[1]))

    def as_row(self) -> dict:
        return {"suite": self.suite, "n": self.n, "cell_id": self.id}


def plan(config: dict, suite: str) -> dict:
    return {ToyCell(suite, n): {"n": n} for n in sorted(config["suites"][suite]["toys"]["sizes"])}


# While a file of this name (n formatted in) is in the working directory, that cell's job
# dies before returning, as a job killed by its scheduler does: a failure the next run retries.
DIES_WHILE = "toy-n{}-dies"


def run_toy(cell: ToyCell, spec: dict):
    def body(job: Job) -> list[dict]:
        if Path(DIES_WHILE.format(spec["n"])).exists():
            os._exit(9)
        if spec["n"] == 13:
            job.skip("13 is unlucky")
        job.record.update(status="ok", total=sum(range(spec["n"])))
        return [{"t_s": 0.0, "gpu": 0, "power_w": 1.0}]

    return run_in_frame("toy", cell, spec, body)


def write_tables(records: list[str], out: dict) -> str:
    import pandas as pd

    from flashwatt.records import atomic_write, read_record

    rows = []
    for path in records:
        record = read_record(path)
        rows.append({**record["cell"], "status": record["status"], "total": record.get("total")})
    table = pd.DataFrame(rows)
    atomic_write(out["toys"], lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out["csv"], lambda tmp: table.to_csv(tmp, index=False))
    return table["status"].value_counts().to_string()


def draw_totals(table):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.bar(table["n"].astype(str), table["total"].fillna(0))
    ax.set_xlabel("n")
    ax.set_ylabel("sum of 0..n-1")
    return fig


FIGURES = {"toy_totals": FigureSpec("toy_totals", "pdf", "Sum of 0..n-1 per toy cell", "Each toy cell's sum.",
                                    draw_totals, parquet_table("toys"))}


KIND = Kind(
    name="toy",
    section="toys",
    cell=ToyCell,
    plan=plan,
    job="toy_kind:run_toy",
    tables=(TableFile("toys", "toys.parquet"), TableFile("csv", "toys.csv", about="toy cells")),
    write_tables="toy_kind:write_tables",
    figures=FIGURES,
    schema={"type": "object", "additionalProperties": False, "required": ["sizes"],
            "properties": {"sizes": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}},
    rule_prefix="toy_",
    runtime_min=5,
)
