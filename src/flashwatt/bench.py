"""TFLOP/s of our CUDA kernel beside PyTorch's FlashAttention-2 and cuDNN SDPA backends.

    python -m flashwatt.bench [--out bench.csv] [--variants] [--dtypes bf16,fp16] [--max-seq-len N]
                              [--rounds 3] [--min-time-ms 100] [--pass fwd|fwd_bwd|bwd]
                              [--bwd-tiles n128_m64_w8,n64_m64_w4] [--one-l2-section] [--deterministic]

`--pass fwd_bwd` times forward and backward together (FLOPs 3.5x the forward's, as `Cell`
counts them) and checks our kernel's gradients against FlashAttention-2's as well.
`--pass bwd` times the backward alone (FLOPs 2.5x the forward's): each input set's forward
runs once before the timing, and a timed call is autograd's backward from its saved
tensors (retain_graph), so every backend is timed on exactly its own backward kernels.
As torch.cuda.make_graphed_callables does, the forwards run captured in a CUDA graph of
their own (replayed once), so that the backward, which reads what they saved, can be
captured and timed by graph replays like every other point (FlashAttention-2's backward of
a forward run outside a graph cannot be captured).
`--bwd-tiles` (fwd_bwd, bwd) also times the custom kernel with each named backward tile
(custom_backward.BWD_TILES; the forward is the default launch) beside it, as
`custom:bwd=<tile>` columns and rows with the tile in the CSV's `backward_tile` column.
`--one-l2-section` also times the custom kernel with every (batch, head) pair in one L2
section (flashwatt.kernels.l2_sections: the work order before sections), as `custom:l2=0`.
`--deterministic` (fwd_bwd, bwd) also times the custom kernel with its deterministic
backward (dQ in a pass of its own, no atomics), as `custom:det`.
`--dtypes fp8` times our fp8 forward against our bf16 forward on the same bf16 inputs, in the
same rotated rounds (flashwatt.bench_fp8): the whole call with its quantisation (`custom`), the
kernel alone on inputs quantised beforehand (`custom:attention`), the quantisation alone
(`custom:quantize`), every fp8 tile, our bf16 forward (`custom@bf16`), FlashAttention-2 and
cuDNN at bf16, and the fp8 peers that are installed; fp8 outputs are checked against
FlashAttention-2's bf16 output within fp8's tolerance.

Shapes: the flash-attention convention (16k tokens per batch, H*D = 2048, (B, L) from
(32, 512) to (1, 16384), D in {64, 128}) plus the seed shape (B=16, H=8, L=1024, D=64),
causal and not. Every backend runs through the kernel registry the pipeline's cells use,
in the same process, and is timed by the pipeline's one timing method (flashwatt.timing:
CUDA-graph replays, input sets rotated past L2); FLOPs come from `Cell`. Per shape, every
backend is timed in `--rounds` rounds (3), the order rotated each round, and the median
over the rounds is reported (the CSV's `round_spread` is max/min - 1 of the rounds): on a
GPU at its power limit the same kernel measured early or late in a fixed order differed by
up to 12%. `custom` is the default launch for the device; on Hopper every wgmma tile that
fits the shape runs beside it in the forward pass (`custom:<tile>`). Every custom output
is checked against sdpa_flash's before it is timed; a failed check is printed and
recorded, its time is not reported, and the exit status is 1.
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys

SHAPES = [(32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
SEED = (16, 8, 1024, 64)
REFERENCE = "sdpa_flash"  # first in every shape: the output the custom runs are checked against
ONE_SECTION = "one L2 section"  # a run of the custom kernel with l2_section=0
DETERMINISTIC = "deterministic"  # a run of the custom kernel with the deterministic backward


def round_order(entries: list, r: int, rounds: int) -> list:
    """The order of round r of `rounds`: the list rotated by r / rounds of its length, so
    that over the rounds each backend is timed early, in the middle and late. The GPU runs
    at its power limit here; a kernel timed after a cooler one starts at a higher clock, so
    one fixed order favours whichever backend follows the coolest (kernels/NOTES.md, "Head
    dim 64: three consumer warpgroups")."""
    if not entries:
        return []
    k = (r * len(entries)) // rounds % len(entries)
    return entries[k:] + entries[:k]


def cases(head_dims: list[int], max_seq_len: int) -> list[tuple[int, int, int, int, int]]:
    """(B, H, L, D, Hkv) of the benchmark, the seed shape first."""
    out = [(B, 2048 // D, L, D) for D in head_dims for B, L in SHAPES if L <= max_seq_len]
    if SEED not in out and SEED[2] <= max_seq_len:
        out.insert(0, SEED)
    return [(B, H, L, D, H) for B, H, L, D in out]


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """(B, H, L, D, Hkv) from "BxHxLxD" or "BxH/HkvxLxD"; ValueError if it is neither."""
    parts = text.lower().split("x")
    if len(parts) != 4:
        raise ValueError(text)
    heads, _, kv = parts[1].partition("/")
    B, H, L, D = (int(n) for n in (parts[0], heads, parts[2], parts[3]))
    Hkv = int(kv) if kv else H
    if min(B, H, L, D, Hkv) <= 0 or H % Hkv:
        raise ValueError(text)
    return B, H, L, D, Hkv


class CustomLaunch:
    """The custom kernel with a named backward tile and/or an L2 section size (None: the
    defaults): comparisons of backward tiles and of work orders."""

    name = "custom"
    differentiable = True

    def __init__(self, backward_tile: str | None = None, l2_section: int | None = None,
                 deterministic: bool | None = None):
        from flashwatt.kernels.custom import Custom

        self.tile = backward_tile
        self.l2_section = l2_section
        self.deterministic = deterministic
        self._custom = Custom()

    def supports(self, cell, device) -> str | None:
        from flashwatt.kernels.custom_backward import backward_plan

        reason = self._custom.supports(cell, device)
        if reason or cell.pass_ == "fwd":
            return reason
        try:
            backward_plan(cell.precision, cell.head_dim, self.tile)
        except ValueError as err:
            return str(err)
        return None

    def __call__(self, q, k, v, cell):
        from flashwatt.kernels.custom_autograd import flash_attention

        return flash_attention(q, k, v, cell.causal, cell.variant, precision=cell.precision, backward_tile=self.tile,
                               l2_section=self.l2_section, deterministic=self.deterministic)


def time_part(cell, kernel, part: str, device, settings, kv_heads: int | None = None) -> dict:
    """The pipeline's timing of one part of a cell's call (kernel.parts: an fp8 call's
    quantisation or its kernel on operands quantised beforehand), on the cell's input sets."""
    import torch

    from flashwatt import measure
    from flashwatt.timing import Workload, time_workload

    inputs = measure.make_inputs(cell, device, settings.seed, measure.input_sets_needed(cell, device, kv_heads),
                                 kv_heads)
    call = kernel.parts(cell, inputs)[part]
    with torch.no_grad():
        per_call_s = measure.warm_up(call, device, settings.warmup_ms)
        return time_workload(Workload.build(call, device, per_call_s), settings)


def time_cell(cell, kernel, device, settings, backward_only: bool = False, kv_heads: int | None = None) -> dict:
    """The pipeline's timing of one cell (median ms per call, eager ms beside it); with
    backward_only, of a fwd_bwd cell's backward alone (see the module docstring); k and v
    with `kv_heads` heads where given."""
    import torch

    from flashwatt import measure
    from flashwatt.timing import Workload, time_workload

    inputs = measure.make_inputs(cell, device, settings.seed, measure.input_sets_needed(cell, device, kv_heads),
                                kv_heads)
    dout = _dout(cell, device) if cell.pass_ == "fwd_bwd" else None
    if backward_only:
        forward = torch.cuda.CUDAGraph()
        with torch.enable_grad(), torch.cuda.graph(forward):
            outs = [kernel(q, k, v, cell) for q, k, v in inputs]
        forward.replay()

        def call(i: int, _saved_by=forward):  # the forward graph's pool holds what the backward reads
            return torch.autograd.grad(outs[i % len(outs)], inputs[i % len(inputs)], dout, retain_graph=True)
    else:
        call = measure.make_call(kernel, cell, inputs, dout)
    with torch.enable_grad() if dout is not None else torch.no_grad():
        per_call_s = measure.warm_up(call, device, settings.warmup_ms)
        return time_workload(Workload.build(call, device, per_call_s), settings)


def _dout(cell, device):
    """The output gradient of a fwd_bwd run: seeded N(0, 1), as the pipeline's cells use."""
    import torch

    from flashwatt import measure

    gen = torch.Generator(device=device).manual_seed(2)
    shape = (cell.batch, cell.heads, cell.seq_len, cell.head_dim)
    return torch.randn(shape, generator=gen, device=device).to(measure.DTYPES[cell.precision])


def _outputs(kernel, cell, device, kv_heads: int | None = None) -> list:
    """The forward's output and, for fwd_bwd, dQ, dK, dV, in float64."""
    import torch

    from flashwatt import measure

    q, k, v = measure.make_inputs(cell, device, 0, 1, kv_heads)[0]
    if cell.pass_ == "fwd":
        with torch.no_grad():
            return [kernel(q, k, v, cell).double()]
    with torch.enable_grad():
        out = kernel(q, k, v, cell)
        grads = torch.autograd.grad(out, (q, k, v), _dout(cell, device))
    return [t.detach().double() for t in (out, *grads)]


def _parse_arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list, list[str], list[str]]:
    """The command line, checked: (arguments, shapes, masks, backward tiles). A bad value
    exits with the option and what it allows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="CSV path for the measurements")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--max-seq-len", type=int, default=16384, help="leave out the shapes with longer sequences")
    ap.add_argument("--variants", action="store_true", help="also time every custom tile variant")
    ap.add_argument("--min-time-ms", type=float, default=100, help="timed device time per point and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times each backend is timed per shape, the order rotated every round; the median is reported")
    ap.add_argument("--pass", dest="pass_", choices=["fwd", "fwd_bwd", "bwd"], default="fwd")
    ap.add_argument("--one-l2-section", action="store_true",
                    help="also time the custom kernel with every (batch, head) pair in one L2 section")
    ap.add_argument("--shapes", default="",
                    help="BxHxLxD shapes to time instead of the default set (comma-separated, e.g. 1x32x4096x128); "
                         "H/Hkv for grouped-query attention (1x32/8x4096x128: 32 query heads over 8 K/V heads)")
    ap.add_argument("--masks", default="full,causal", help="which of full,causal to time (comma-separated)")
    ap.add_argument("--bwd-tiles", default="",
                    help="fwd_bwd: also time the custom kernel with each of these backward tiles (comma-separated)")
    ap.add_argument("--deterministic", action="store_true",
                    help="fwd_bwd, bwd: also time the custom kernel with its deterministic backward")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    if args.deterministic and args.pass_ == "fwd":
        ap.error("--deterministic needs --pass fwd_bwd or bwd")
    if "fp8" in args.dtypes.split(",") and args.pass_ != "fwd":
        ap.error("--dtypes fp8 times the forward only (fp8 has no backward): use --pass fwd")
    try:
        shapes = [parse_shape(text) for text in args.shapes.split(",") if text]
    except ValueError:
        ap.error(f"--shapes {args.shapes!r}: give positive BxHxLxD or BxH/HkvxLxD with H a multiple of Hkv, "
                 "comma-separated (e.g. 1x32x4096x128,1x32/8x4096x128)")
    masks = [m for m in args.masks.split(",") if m]
    if not masks or any(m not in ("full", "causal") for m in masks):
        ap.error(f"--masks {args.masks!r}: give full, causal or both (comma-separated)")
    bwd_tiles = [t for t in args.bwd_tiles.split(",") if t]
    if bwd_tiles:
        from flashwatt.kernels.custom_backward import BWD_TILES

        if args.pass_ == "fwd":
            ap.error("--bwd-tiles needs --pass fwd_bwd or bwd")
        unknown = [t for t in bwd_tiles if t not in BWD_TILES]
        if unknown:
            ap.error(f"unknown backward tile(s) {', '.join(unknown)}; allowed: {', '.join(BWD_TILES)}")
    return args, shapes, masks, bwd_tiles


def _header(args: argparse.Namespace, bwd_tiles: list[str], hopper: bool) -> str:
    """The printed table's column names: one column pair per extra custom launch asked for."""
    return (f"{'dtype':5} {'B':>3} {'H':>5} {'L':>6} {'D':>4} {'mask':6} {'custom':>8} {'flash':>8} {'cudnn':>8} "
            f"{'cust/fl':>8} {'cust/cu':>8}" + (f" {'wgmma':>8} {'wg/fl':>6}" if hopper else "")
            + "".join(f" {'bwd=' + t:>16} {'/fl':>6}" for t in bwd_tiles)
            + (f" {'l2=0':>8} {'cust/l2=0':>7}" if args.one_l2_section else "")
            + (f" {'det':>8} {'det/cust':>8}" if args.deterministic else ""))


def _heads(H: int, Hkv: int) -> str:
    return f"{H}/{Hkv}" if Hkv != H else f"{H}"


def _runs(args: argparse.Namespace, bwd_tiles: list[str], hopper: bool, precision: str,
          head_dim: int) -> list[tuple[str, str, str, str]]:
    """(kernel, tile variant, launch, precision) of every run of one shape, the reference
    first (the custom runs are checked against its output)."""
    from flashwatt.kernels.custom import TILES, WGMMA

    if precision == "fp8":
        from flashwatt.bench_fp8 import fp8_runs

        return fp8_runs(args.variants or hopper, head_dim)
    runs = [(REFERENCE, "", ""), ("custom", "", ""), ("sdpa_cudnn", "", "")]
    runs += [("custom", t, "") for t, tile in TILES.items()
             if head_dim in tile.head_dims and precision in tile.precisions
             and (args.variants or (hopper and tile.mma == WGMMA and args.pass_ == "fwd"))]
    runs += [("custom", "", t) for t in bwd_tiles]
    if args.one_l2_section:
        runs.append(("custom", "", ONE_SECTION))
    if args.deterministic:
        runs.append(("custom", "", DETERMINISTIC))
    return [(*run, precision) for run in runs]


def _entry(kname: str, variant: str, launch: str, cell, group_precision: str) -> dict:
    """One run of a shape: its label and kernel, and the slots its check and its rounds fill.
    A run at another precision than its group's (our bf16 forward beside fp8) says so in its
    label (`custom@bf16`); a part of a call (flashwatt.bench_fp8.PART) is named after it."""
    from flashwatt.bench_fp8 import PART, peer_kernel
    from flashwatt.kernels import get_kernel

    part = launch[len(PART):] if launch.startswith(PART) else ""
    if part:
        return dict(kname=kname, variant=variant, launch=launch, bwd_tile="", part=part, cell=cell,
                    label=f"{kname}:{part}", kernel=get_kernel(kname), err=math.nan, ms=[], timing={}, failed=None)
    peer = peer_kernel(kname)
    if peer is not None:
        return dict(kname=kname, variant=variant, launch=launch, bwd_tile="", part="", cell=cell, label=kname,
                    kernel=peer, err=math.nan, ms=[], timing={}, failed=None)
    bwd_tile = launch if launch not in (ONE_SECTION, DETERMINISTIC) else ""
    label = f"{kname}:{variant}" if variant else kname
    label = f"{label}@{cell.precision}" if cell.precision != group_precision and kname == "custom" else label
    label = f"{label}:bwd={bwd_tile}" if bwd_tile else label
    label = f"{label}:l2=0" if launch == ONE_SECTION else label
    label = f"{label}:det" if launch == DETERMINISTIC else label
    kernel = (CustomLaunch(bwd_tile or None, 0 if launch == ONE_SECTION else None,
                           True if launch == DETERMINISTIC else None) if launch
              else get_kernel(kname))
    return dict(kname=kname, variant=variant, launch=launch, bwd_tile=bwd_tile, part="", cell=cell,
                label=label, kernel=kernel, err=math.nan, ms=[], timing={}, failed=None)


def _check_against_reference(entry: dict, outs: list, reference: list | None, precision: str) -> None:
    """Set the entry's largest error against the reference's outputs (output, dQ, dK, dV);
    raise when there is no reference or an error is past the precision's tolerance."""
    from flashwatt.measure import relative_error
    from flashwatt.vocabulary import TOLERANCE

    if reference is None:
        raise RuntimeError(f"no {REFERENCE} output to check it against: not timed")
    names = ["output", "dQ", "dK", "dV"]
    errors = [relative_error(a, b) for a, b in zip(outs, reference)]
    entry["err"] = max(errors)
    for what, err in zip(names, errors):
        tol = TOLERANCE[precision]["fwd" if what == "output" else "grad"]
        if not err <= tol:
            raise RuntimeError(f"{what} differs from {REFERENCE}'s by {err:.2e} (> {tol:.0e})")


def _checked_entries(runs: list[tuple[str, str, str, str]], precision: str, shape: tuple, causal: bool,
                     cell_pass: str, device) -> list[dict]:
    """One entry per run, each run once before anything is timed and every custom (and peer)
    output checked against the reference's; a refused shape or a failed check is kept in the
    entry's `failed`. A part of a call is not checked itself: it fails with its whole call
    (the run of the same kernel and precision without a variant). The reference's outputs are
    dropped on return: their memory is not held through the timing."""
    import torch

    from flashwatt.attention.cell import Cell

    B, H, L, D, Hkv = shape
    reference = None
    entries: list[dict] = []
    for kname, variant, launch, run_precision in runs:
        cell = Cell("bench", "custom" if kname not in _registry_names() else kname, run_precision, L, B, H, D, causal,
                    cell_pass, variant)
        entry = _entry(kname, variant, launch, cell, precision)
        entries.append(entry)
        try:
            reason = entry["kernel"].supports(entry["cell"], device)
            if reason:
                raise RuntimeError(reason)
            if entry["part"]:
                continue
            outs = _outputs(entry["kernel"], entry["cell"], device, Hkv)
            if kname == REFERENCE:
                reference = outs
            elif kname != "sdpa_cudnn":
                _check_against_reference(entry, outs, reference, run_precision)
            del outs
        except Exception as err:  # a refused shape or a failed check is a result, not a crash
            entry["failed"] = err
        torch.cuda.empty_cache()
    for entry in entries:
        whole = next((e for e in entries if e["kname"] == entry["kname"] and not e["part"] and not e["variant"]
                      and e["cell"].precision == entry["cell"].precision), None)
        if entry["part"] and entry["failed"] is None and whole is not None and whole["failed"] is not None:
            entry["failed"] = RuntimeError(f"its whole call failed: {whole['failed']}")
    return entries


def _registry_names() -> tuple[str, ...]:
    from flashwatt.kernels import registry

    return registry.kernel_names()


def _time_in_rounds(entries: list[dict], rounds: int, backward_only: bool, device, settings, kv_heads: int) -> None:
    """Time every entry that passed its check once per round, the order rotated each round
    (round_order); each round's median is appended to the entry's `ms`."""
    import torch

    for r in range(rounds):
        for entry in round_order([e for e in entries if e["failed"] is None], r, rounds):
            try:
                if entry["part"]:
                    timing = time_part(entry["cell"], entry["kernel"], entry["part"], device, settings, kv_heads)
                else:
                    timing = time_cell(entry["cell"], entry["kernel"], device, settings,
                                       backward_only=backward_only, kv_heads=kv_heads)
                entry["ms"].append(timing["median_ms"])
                entry["timing"] = timing
            except Exception as err:
                entry["failed"] = err
            torch.cuda.empty_cache()


def _results(entries: list[dict], pass_: str, device_name: str, precision: str, shape: tuple,
             causal: bool) -> tuple[dict[str, float], list[dict], int]:
    """TFLOP/s by label, the CSV rows and the number of failed custom runs of one shape;
    each failure is printed."""
    B, H, L, D, Hkv = shape
    result: dict[str, float] = {}
    rows: list[dict] = []
    failed_checks = 0
    for entry in entries:
        cell, label, err = entry["cell"], entry["label"], entry["failed"]
        if err is not None:
            failed_checks += entry["kname"] == "custom" and "compute capability" not in str(err)
            print(f"  {label} failed on {precision} {B}x{_heads(H, Hkv)}x{L}x{D} causal={causal}: "
                  f"{str(err).splitlines()[0][:300]}", file=sys.stderr)
        rounds_ms = entry["ms"] if err is None else []  # one median per round
        ms = statistics.median(rounds_ms) if rounds_ms else math.nan
        spread = max(rounds_ms) / min(rounds_ms) - 1 if rounds_ms else math.nan
        flops = cell.flops - cell.fwd_flops if pass_ == "bwd" else cell.flops
        tflops = flops / (ms * 1e-3) / 1e12
        result[label] = tflops
        timing = entry["timing"] if err is None else {}
        rows.append(dict(device=device_name, dtype=cell.precision, batch=B, heads=H, kv_heads=Hkv, seq_len=L,
                         head_dim=D, causal=causal, kernel=entry["kname"], variant=entry["variant"], part=entry["part"],
                         backward_tile=entry["bwd_tile"],
                         l2_section="one" if entry["launch"] == ONE_SECTION else "auto",
                         deterministic=entry["launch"] == DETERMINISTIC, pass_=pass_,
                         method=timing.get("method"), why_not_graph=timing.get("fallback_reason", ""),
                         ms=ms, rounds=len(rounds_ms), round_spread=round(spread, 4),
                         eager_ms=timing.get("eager_ms", math.nan),
                         tflops=round(tflops, 2), rel_err_vs_flash=entry["err"]))
    return result, rows, failed_checks


def _summary_line(result: dict[str, float], args: argparse.Namespace, bwd_tiles: list[str], hopper: bool,
                  precision: str, shape: tuple, causal: bool) -> str:
    """One shape's row of the printed table (the columns of `_header`)."""
    B, H, L, D, Hkv = shape
    fl, cu, cust = result[REFERENCE], result["sdpa_cudnn"], result["custom"]
    line = (f"{precision:5} {B:>3} {_heads(H, Hkv):>5} {L:>6} {D:>4} {'causal' if causal else 'full':6} "
            f"{cust:8.1f} {fl:8.1f} {cu:8.1f} {cust / fl:8.3f} {cust / cu:8.3f}")
    if hopper:
        wg = max((t for n, t in result.items() if n.startswith("custom:wgmma") and t == t), default=math.nan)
        line += f" {wg:8.1f} {wg / fl:6.3f}"
    for t in bwd_tiles:
        bt = result[f"custom:bwd={t}"]
        line += f" {bt:16.1f} {bt / fl:6.3f}"
    if args.one_l2_section:
        one = result["custom:l2=0"]
        line += f" {one:8.1f} {cust / one:7.3f}"
    if args.deterministic:
        det = result["custom:det"]
        line += f" {det:8.1f} {det / cust:8.3f}"
    return line


def _write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {path}")


def main(argv: list[str] | None = None) -> int:
    args, shapes, masks, bwd_tiles = _parse_arguments(argv)

    import torch

    from flashwatt.build import build_info, load_extension
    from flashwatt.kernels.custom import WGMMA_CAPABILITY
    from flashwatt.settings import MeasureSettings

    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    load_extension()
    print(f"device: {name}  torch {torch.__version__}  CUDA {torch.version.cuda}  build {build_info()}", flush=True)
    settings = MeasureSettings(min_time_ms=args.min_time_ms, warmup_ms=100)
    hopper = torch.cuda.get_device_capability(device) == WGMMA_CAPABILITY

    from flashwatt.bench_fp8 import fp8_header, fp8_summary_line

    cell_pass = "fwd" if args.pass_ == "fwd" else "fwd_bwd"  # bwd: a fwd_bwd cell, its backward timed
    rows: list[dict] = []
    failed_checks = 0
    for precision in args.dtypes.split(","):
        header = fp8_header() if precision == "fp8" else _header(args, bwd_tiles, hopper)
        print(header + "\n" + "-" * len(header), flush=True)
        for shape in shapes or cases([int(x) for x in args.head_dims.split(",")], args.max_seq_len):
            for causal in [m == "causal" for m in masks]:
                runs = _runs(args, bwd_tiles, hopper, precision, shape[3])
                entries = _checked_entries(runs, precision, shape, causal, cell_pass, device)
                _time_in_rounds(entries, args.rounds, args.pass_ == "bwd", device, settings, kv_heads=shape[4])
                result, shape_rows, failed = _results(entries, args.pass_, name, precision, shape, causal)
                rows += shape_rows
                failed_checks += failed
                line = (fp8_summary_line(result, shape, causal) if precision == "fp8"
                        else _summary_line(result, args, bwd_tiles, hopper, precision, shape, causal))
                print(line, flush=True)
    if args.out and rows:
        _write_csv(args.out, rows)
    if failed_checks:
        print(f"{failed_checks} custom runs failed (above): their times are not reported", file=sys.stderr)
    return 1 if failed_checks else 0


if __name__ == "__main__":
    raise SystemExit(main())
