"""docs/parallel.md from the suites' tables: every multi-GPU cell measured, against one GPU.

    python -m flashwatt.distributed.parallel_tables [--results results [results-g4 ...]]
        [--suites distributed models] [--out docs/parallel.md]

Reads <results>/<suite>/distributed.parquet (attention across GPUs) and <results>/<suite>/models.parquet
(whole model steps) of the named suites, keeps the cells on more than one GPU, and writes:

- attention: per cell its time, the one-GPU time in the same job, speedup, efficiency,
  memory per GPU, exposed communication, joules per token, and why
  (flashwatt.distributed.parallel_reasons);
- model steps: step time, tokens per second, speedup and efficiency against the same
  model, backend and step on one GPU, MFU, memory per GPU, exposed communication (its
  share of the profiled step), joules per token, and why;
- the targets of issue 40, each with the cells that speak to it;
- the cells that did not end ok, with their reasons;
- every device the rows ran on.

Several results folders (one per machine: a run on 2 GPUs, another on 4) go into one document;
a model cell is compared with the one-GPU cell of its own folder, measured on the same machine.

Nothing is written by hand: rerun it after any run and the file follows the tables.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from flashwatt.distributed.parallel_reasons import attention_reason, model_reason
from flashwatt.models.recompute import recompute_percent, recompute_words

GIB = 2 ** 30
# a model cell's one-GPU cell: the same step in the same suite of the same results folder
ONE_GPU_KEYS = ["results", "suite", "model", "backend", "precision", "phase", "seq_len", "batch", "recompute", "compiled"]
# (what, table, row filter, column, at least, which cells must reach it): `every` cell the
# filter keeps (each strategy a target names), or `any` of them where the cells are
# settings of one step to choose among (Llama-3-8B's recompute shares: the step meets
# its MFU target when one share that fits reaches it).
TARGETS = [
    ("zigzag and Ulysses, Llama-3-8B attention, L 128k, fwd+bwd, 4 GPUs: speedup", "attention",
     lambda r: r["strategy"] in ("zigzag", "ulysses") and r["seq_len"] == 131072 and r["pass"] == "fwd_bwd"
     and r["heads"] == 32 and r["gpus"] == 4, "speedup", 3.6, "every"),
    ("zigzag and Ulysses, Llama-3-8B attention, L 128k, fwd+bwd, 8 GPUs: speedup", "attention",
     lambda r: r["strategy"] in ("zigzag", "ulysses") and r["seq_len"] == 131072 and r["pass"] == "fwd_bwd"
     and r["heads"] == 32 and r["gpus"] == 8, "speedup", 6.5, "every"),
    ("FSDP, Llama-3.2-1B training step, 4 GPUs: speedup over one GPU", "models",
     lambda r: r["model"] == "llama_3_2_1b" and r["strategy"] == "fsdp" and r["gpus"] == 4, "speedup_vs_one_gpu", 3.6,
     "every"),
    ("FSDP, Llama-3-8B training step, L 8192: MFU", "models",
     lambda r: r["model"] == "llama_3_8b" and r["strategy"] == "fsdp" and r["seq_len"] == 8192, "mfu", 0.40, "any"),
]


def _fmt(value, spec: str = ".3g", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return f"{value:{spec}}{unit}"


def _markdown(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _read(roots: list[Path], suites: list[str], name: str) -> pd.DataFrame:
    frames = [pd.read_parquet(path).assign(results=str(root))
              for root in roots for suite in suites if (path := root / suite / name).exists()]
    for frame in frames:  # a table aggregated before shares has true/false, which the concatenation would make 1/0
        if "recompute" in frame:
            frame["recompute"] = frame["recompute"].map(recompute_percent)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def attention_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The distributed cells on several GPUs, each with its reason."""
    if table.empty:
        return table
    many = table[table["gpus"] > 1].copy()
    exposed = many["forward_comm_exposed_ms"].fillna(0) + many["backward_comm_exposed_ms"].fillna(0)
    many["exposed_ms"] = exposed.where(many["status"] == "ok")
    many["why"] = [attention_reason(row) for _, row in many.iterrows()]
    return many.sort_values(["heads", "precision", "seq_len", "strategy", "block", "gpus"])


def _one_gpu_rows(table: pd.DataFrame) -> dict[tuple, pd.Series]:
    ok = table[(table["gpus"] == 1) & (table["status"] == "ok")]
    return {tuple(row.get(k) for k in ONE_GPU_KEYS): row for _, row in ok.iterrows()}


def model_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The model cells on several GPUs, each with its reason against its one-GPU cell."""
    if table.empty:
        return table
    one = _one_gpu_rows(table)
    many = table[table["gpus"] > 1].copy()
    many["why"] = [model_reason(row, one.get(tuple(row.get(k) for k in ONE_GPU_KEYS))) for _, row in many.iterrows()]
    return many.sort_values(["model", "backend", "seq_len", "strategy", "gpus"])


def attention_markdown(rows: pd.DataFrame) -> str:
    header = ["strategy, block", "precision", "L", "H/K/D", "mask, pass", "GPUs", "ms", "one GPU, ms", "speedup",
              "efficiency", "GiB per GPU", "exposed comm, ms", "mJ/token", "why"]
    body = [[f"{r['strategy']}, {r['block']}", r["precision"], f"{int(r['seq_len'])}",
             f"{int(r['heads'])}/{int(r['kv_heads'])}/{int(r['head_dim'])}",
             f"{'causal' if r['causal'] else 'full'}, {r['pass']}", _gpus(r) + (
                 f" ({int(r['nodes'])} nodes)" if r.get("nodes", 1) and r.get("nodes", 1) > 1 else ""),
             _fmt(r.get("total_ms"), ".4g"), _fmt(r.get("single_gpu_total_ms"), ".4g"), _fmt(r.get("speedup"), ".2f", "x"),
             _fmt(r.get("efficiency"), ".2f"), _fmt(_div(r.get("peak_bytes_per_gpu"), GIB), ".2f"),
             _fmt(r["exposed_ms"], ".3g"), _fmt(_div(r.get("j_per_token"), 1e-3), ".3g"), r["why"]]
            for _, r in rows.iterrows()]
    return _markdown(body, header)


def _div(value, by: float):
    return None if value is None or pd.isna(value) else value / by


def model_markdown(rows: pd.DataFrame) -> str:
    header = ["model, backend", "phase, L, B", "GPUs, strategy", "step ms", "tokens/s", "speedup", "efficiency",
              "MFU", "GiB per GPU", "exposed comm, ms (share)", "mJ/token", "why"]
    body = []
    for _, r in rows.iterrows():
        share = r.get("exposed_share_of_step")
        exposed = "–" if share is None or pd.isna(share) else f"{share * r['step_ms']:.3g} ({share:.0%})"
        body.append([f"{r['model']}, {r['backend']}" + _recompute_words(r),
                     f"{r['phase']}, {int(r['seq_len'])}, {int(r['batch'])}", f"{_gpus(r)}, {r['strategy']}",
                     _fmt(r.get("step_ms"), ".4g"), _fmt(r.get("tokens_per_s"), ",.0f"),
                     _fmt(r.get("speedup_vs_one_gpu"), ".2f", "x"), _fmt(r.get("scaling_efficiency"), ".2f"),
                     _fmt(r.get("mfu"), ".1%"), _fmt(_div(r.get("peak_allocated_bytes"), GIB), ".1f"), exposed,
                     _fmt(_div(r.get("j_per_token"), 1e-3), ".3g"), r["why"]])
    return _markdown(body, header)


def _gpus(row: pd.Series) -> str:
    """'4 H100': the row's GPU count and the GPU it ran on (a document joins machines of
    several kinds, and a row's figures are its device's); the count alone where the cell
    recorded no device (it failed before measuring)."""
    device = row.get("device")
    if device is None or pd.isna(device) or not str(device).strip():
        return f"{int(row['gpus'])}"
    words = [w for w in str(device).split() if w.upper() != "NVIDIA"]
    return f"{int(row['gpus'])} {words[0] if words else device}"


def _recompute_words(row: pd.Series) -> str:
    """', recompute' or ', recompute 50%' for a model row that recomputes, '' otherwise."""
    words = recompute_words(row["recompute"]) if "recompute" in row else ""
    return f", {words}" if words else ""


def targets_markdown(attention: pd.DataFrame, models: pd.DataFrame) -> str:
    body = []
    for what, source, keep, column, least, need in TARGETS:
        table = attention if source == "attention" else models
        hits = table[[bool(keep(r)) for _, r in table.iterrows()]] if not table.empty else table
        ok = hits[hits["status"] == "ok"] if not hits.empty else hits
        if ok.empty:
            body.append([what, f"{least:g}", "not measured", "–"])
            continue
        label = "block" if source == "attention" else "backend"
        values = [f"{r['strategy']}/{r[label]}{_recompute_words(r)} on {_gpus(r)}: {r[column]:.3g}"
                  for _, r in ok.iterrows()]
        met = (all if need == "every" else any)(r[column] >= least for _, r in ok.iterrows())
        body.append([what, f"{least:g}", "; ".join(values), "met" if met else "not met"])
    return _markdown(body, ["target", "at least", "measured", ""])


def _not_ok(attention: pd.DataFrame, models: pd.DataFrame) -> list[str]:
    lines = []
    for table in (attention, models):
        if not table.empty:
            lines += [f"- `{r['cell_id']}`: {r['status']} ({r.get('reason')})" for _, r in table.iterrows()
                      if r["status"] != "ok"]
    return lines


def _devices(*tables: pd.DataFrame) -> list[str]:
    names = set()
    for table in tables:
        if not table.empty and "device" in table:
            names |= {str(d) for d in table["device"].dropna()}
    return sorted(names)


def parallel_markdown(distributed: pd.DataFrame, models: pd.DataFrame, command: str) -> str:
    attention, steps = attention_rows(distributed), model_rows(models)
    devices = _devices(attention, steps)
    parts = ["# Several GPUs: speedup, efficiency, memory, communication and energy per cell", "",
             f"Written by `{command}` from the suites' tables; do not edit by hand. Devices: "
             + (", ".join(devices) if devices else "none measured") + ".", "",
             "Each row's *why* is built from its own measured fields (flashwatt.distributed.parallel_reasons): "
             "exposed communication, load imbalance, blocks slower than their share of one GPU, the optimizer "
             "every GPU runs whole under context parallelism, and whether the weights are sharded or replicated.",
             "", "## Targets", "", targets_markdown(distributed, models), "",
             "## Attention across GPUs (distributed cells)", "",
             attention_markdown(attention) if not attention.empty else "No distributed cell on several GPUs.", "",
             "## Model steps on several GPUs", "",
             model_markdown(steps) if not steps.empty else "No model cell on several GPUs.", ""]
    failed = _not_ok(attention, steps)
    if failed:
        parts += ["## Cells that did not end ok", "", *failed, ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", default=[Path("results")], type=Path,
                        help="results folders, one per machine")
    parser.add_argument("--suites", nargs="+", default=["distributed", "models"])
    parser.add_argument("--out", default="docs/parallel.md", type=Path)
    args = parser.parse_args(argv)
    missing = [str(root) for root in args.results if not root.is_dir()]
    if missing:  # a folder named by hand that is not there: not a table "not measured"
        parser.error(f"--results: no such folder: {', '.join(missing)}")
    command = "python -m flashwatt.distributed.parallel_tables"
    if args.results != [Path("results")]:
        command += " --results " + " ".join(str(root) for root in args.results)
    command += " --suites " + " ".join(args.suites)
    text = parallel_markdown(_read(args.results, args.suites, "distributed.parquet"),
                             _read(args.results, args.suites, "models.parquet"), command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
