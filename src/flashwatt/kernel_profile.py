"""Where a kernel's time goes, from Nsight Compute's warp samples per instruction.

    ncu --set full --import-source no -k regex:flash_fwd -s 3 -c 1 -o prof \\
        python -m flashwatt.kernel_profile run 4x16x4096x128 --precision fp8 [--variant TILE] [--causal]
    ncu ... -k regex:flash_bwd_wgmma -s 3 -c 1 -o prof \\
        python -m flashwatt.kernel_profile run 2x16x8192x128 --pass bwd [--bwd-tile TILE]
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof_sass.csv
    python -m flashwatt.kernel_profile summary prof_sass.csv

`run` calls our forward (or, with --pass bwd, our backward after one forward) a few times on
random inputs (the profiler picks the launch: `-s` skips the warm-up ones); its rate is the
bench's to measure (flashwatt.bench). `summary` reads the SASS page's export:
for each kind of instruction (the opcode without its modifiers) the share of all warp samples
taken while a warp stood at one, split by stall reason, and the instructions with the most
samples. A warp's samples at an instruction are the time it spent there, waiting or issuing,
so the table reads as each warp's time by what it was doing: the fp8 forward's profile in
kernels/NOTES.md ("fp8 forward: the step's latency") is this table.
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path

import pandas as pd

SAMPLES = "Warp Stall Sampling (All Samples)"
# The stall reasons shown (ncu's source-page columns), in the order the table gives them.
STALLS = ("stall_wait", "stall_long_sb", "stall_short_sb", "stall_barrier", "stall_dispatch", "stall_mio",
          "stall_math", "stall_not_selected", "stall_selected", "stall_branch_resolving", "stall_no_inst",
          "stall_misc")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


def read_sass_page(path: Path) -> tuple[str, pd.DataFrame]:
    """The kernel's name and one row per SASS instruction (address, source text, samples and
    the stall columns as numbers) from `ncu --page source --csv --print-source sass`."""
    text = Path(path).read_text()
    first, _, rest = text.partition("\n")
    row = next(csv.reader([first]), [])
    if len(row) < 2 or row[0] != "Kernel Name":
        raise ValueError(f"{path}: not an ncu source-page export (its first line names no kernel: {first[:80]!r})")
    frame = pd.read_csv(io.StringIO(rest), dtype=str)
    missing = [c for c in ("Address", "Source", SAMPLES) if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)} (export the SASS source page with its warp samples)")
    for column in (SAMPLES, *STALLS, "Instructions Executed"):
        if column in frame.columns:
            frame[column] = pd.to_numeric(frame[column].str.replace(",", ""), errors="coerce").fillna(0.0)
    frame["opcode"] = frame["Source"].str.strip().str.replace(_PREDICATE, "", regex=True).str.split().str[0]
    frame["opcode"] = frame["opcode"].str.split(".").str[0]
    return row[1], frame


def by_opcode(frame: pd.DataFrame) -> pd.DataFrame:
    """Per opcode: samples, their share of all (%), instructions executed, and each stall
    reason's share of the opcode's samples (%); most samples first."""
    total = frame[SAMPLES].sum()
    if total <= 0:
        raise ValueError("the export holds no warp samples (profile with the SourceCounters section)")
    stalls = [s for s in STALLS if s in frame.columns]
    grouped = frame.groupby("opcode")[[SAMPLES, *stalls]].sum()
    table = pd.DataFrame({"samples": grouped[SAMPLES], "share_pct": 100.0 * grouped[SAMPLES] / total})
    if "Instructions Executed" in frame.columns:
        table["executed"] = frame.groupby("opcode")["Instructions Executed"].sum()
    for stall in stalls:
        table[stall.removeprefix("stall_") + "_pct"] = 100.0 * grouped[stall] / grouped[SAMPLES].where(
            grouped[SAMPLES] > 0)
    return table.sort_values("samples", ascending=False)


def hottest(frame: pd.DataFrame, count: int = 15) -> pd.DataFrame:
    """The `count` instructions with the most samples, with their share of all (%)."""
    total = frame[SAMPLES].sum()
    top = frame.nlargest(count, SAMPLES)[["Address", "Source", SAMPLES]].copy()
    top["Source"] = top["Source"].str.strip()
    top["share_pct"] = 100.0 * top[SAMPLES] / total
    return top.rename(columns={SAMPLES: "samples"})


def summary(path: Path, top: int = 15) -> str:
    kernel, frame = read_sass_page(path)
    table = by_opcode(frame)
    fmt = lambda x: f"{x:.1f}"  # noqa: E731
    return "\n".join([
        f"{kernel}: {int(frame[SAMPLES].sum())} warp samples",
        "",
        "by kind of instruction (share of all samples; stall reasons as shares of its own):",
        table.head(25).to_string(float_format=fmt),
        "",
        f"the {top} instructions with the most samples:",
        hottest(frame, top).to_string(index=False, float_format=fmt),
    ])


def run(shape: str, precision: str, variant: str, causal: bool, calls: int, pass_: str = "fwd",
        bwd_tile: str = "") -> None:
    """Our forward at `shape` (BxHxLxD) on random inputs, `calls` times, or with pass_ "bwd" our
    backward `calls` times after one forward (the profiler takes one launch; its rate is the
    bench's to measure: flashwatt.bench)."""
    import torch

    from flashwatt.kernels.custom import backward_plan, flash_forward, flash_forward_fp8
    from flashwatt.kernels.custom_backward import flash_backward

    try:
        B, H, L, D = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"shape {shape!r}: expected BxHxLxD, e.g. 4x16x4096x128") from None
    if not torch.cuda.is_available():
        raise SystemExit("flashwatt.kernel_profile run: no CUDA device here (it runs our kernel for the profiler)")
    plan = None
    if pass_ == "bwd":
        if precision == "fp8":
            raise SystemExit("flashwatt.kernel_profile run: fp8 has a forward only (--pass fwd)")
        try:
            plan = backward_plan(precision, D, bwd_tile or None, torch.cuda.get_device_capability())
        except ValueError as e:
            raise SystemExit(f"flashwatt.kernel_profile run: {e}") from None
    torch.manual_seed(0)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16  # fp8: bf16 inputs, quantised in the call
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype) for _ in range(3))
    if pass_ == "bwd":
        out, lse = flash_forward(q, k, v, causal, variant)
        dout = torch.randn_like(out)
        for _ in range(calls):
            flash_backward(dout, q, k, v, out, lse, causal, 1.0 / D**0.5, plan)
        what = f"backward ({plan.tile or plan.path})"
    else:
        forward = flash_forward_fp8 if precision == "fp8" else flash_forward
        for _ in range(calls):
            forward(q, k, v, causal, variant)
        what = "forward"
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()} {precision} {shape} {variant or 'default'} causal={causal}: "
          f"{calls} calls of our {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashwatt.kernel_profile", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="call our forward (or backward) for the profiler")
    r.add_argument("shape", help="BxHxLxD, e.g. 4x16x4096x128")
    r.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp8"))
    r.add_argument("--variant", default="", help="a tile of flashwatt.kernels.custom_variants (default: the default)")
    r.add_argument("--causal", action="store_true")
    r.add_argument("--calls", type=int, default=10)
    r.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd"))
    r.add_argument("--bwd-tile", default="", help="a backward tile (flashwatt.kernels.custom_backward.BWD_TILES; "
                   "default: the default)")
    s = sub.add_parser("summary", help="summarise ncu's SASS source page (CSV)")
    s.add_argument("csv", type=Path)
    s.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.shape, args.precision, args.variant, args.causal, args.calls, args.pass_, args.bwd_tile)
    else:
        try:
            print(summary(args.csv, args.top))
        except (OSError, ValueError) as e:
            print(f"flashwatt.kernel_profile: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
