"""The precision ladder of a suite: what each precision a kernel ran at costs, in accuracy and in
joules, beside the same kernel's bf16 cell of the same shape.

One row per ok cell whose shape (kernel, launch variant aside, L, batch, heads, head dim,
mask, pass) the suite measured at two precisions or more, ordered from the widest precision
to the narrowest. Each row has its error against float64, the error that the bf16 run of the
same kernel had on the same inputs where the cell ran one (fp8 cells do:
`rel_err_bf16_same_inputs`), its time and energy per call, and these against the bf16 cell
of the shape: `speedup_vs_bf16` (bf16's median time over its own), `energy_vs_bf16` (its
energy per call over bf16's: below 1 saves joules) and `error_vs_bf16` (its error over
bf16's on the same inputs where it has that, else over the bf16 cell's).
"""
from __future__ import annotations

import pandas as pd

# Widest first: the order of the ladder's rungs.
RUNGS = ("fp32", "tf32", "fp16", "bf16", "fp8")
BASE = "bf16"
SHAPE = ["kernel", "seq_len", "batch", "heads", "head_dim", "causal", "pass"]
COLUMNS = [
    *SHAPE, "precision", "variant", "rel_err", "rel_err_bf16_same_inputs", "tol", "median_ms", "quantize_ms",
    "tflops", "energy_per_call_j", "gflops_per_w", "speedup_vs_bf16", "energy_vs_bf16", "error_vs_bf16", "device",
]


def precision_ladder(frame: pd.DataFrame) -> pd.DataFrame:
    """The ladder's rows (module docstring) from a suite's summary; empty with COLUMNS where no
    shape ran at two precisions. Of several ok cells at one rung (launch variants), the
    default launch's, else the fastest."""
    ok = frame[(frame["status"] == "ok") & frame["precision"].isin(RUNGS)].copy()
    if ok.empty:
        return pd.DataFrame(columns=COLUMNS)
    ok["_default"] = ok["variant"].fillna("").eq("")
    ok = ok.sort_values(["_default", "median_ms"], ascending=[False, True], kind="stable")
    ok = ok.drop_duplicates(SHAPE + ["precision"], keep="first")
    rows = []
    for _, group in ok.groupby(SHAPE, dropna=False, sort=True):
        if group["precision"].nunique() < 2:
            continue
        base = group[group["precision"] == BASE]
        base = base.iloc[0] if len(base) else None
        group = group.assign(_rung=group["precision"].map(RUNGS.index)).sort_values("_rung")
        for _, row in group.iterrows():
            rows.append({**{c: row.get(c) for c in COLUMNS if c in row.index}, **_against(row, base)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _ratio(a, b):
    return a / b if pd.notna(a) and pd.notna(b) and b else None


def _against(row: pd.Series, base: pd.Series | None) -> dict:
    if base is None:
        return {"speedup_vs_bf16": None, "energy_vs_bf16": None, "error_vs_bf16": None}
    same = row.get("rel_err_bf16_same_inputs")
    return {
        "speedup_vs_bf16": _ratio(base["median_ms"], row["median_ms"]),
        "energy_vs_bf16": _ratio(row["energy_per_call_j"], base["energy_per_call_j"]),
        "error_vs_bf16": _ratio(row["rel_err"], same if pd.notna(same) else base["rel_err"]),
    }
