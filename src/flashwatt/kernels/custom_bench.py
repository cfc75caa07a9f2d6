"""Forward TFLOP/s of the custom kernel next to PyTorch's flash (FA2) and cuDNN SDPA backends.

    python -m flashwatt.kernels.custom_bench [--out bench.csv] [--variants] [--dtypes bf16,fp16]

Shapes: the flash-attention convention (16k tokens per batch, H*D = 2048, (B, L) from
(32, 512) to (1, 16384), D in {64, 128}) plus the seed shape (B=16, H=8, L=1024, D=64),
causal and not. All backends run in the same process, interleaved per shape.
Time: triton.testing.do_bench median after its warm-up; FLOPs = 4*B*H*L^2*D, halved for causal.
`custom` is the default launch for the device; on Hopper every wgmma tile that fits the
shape runs beside it (`custom:<tile>`, the best one printed). Every custom output is checked against
sdpa_flash's (||a - b|| / ||b|| within the precision's bound) before it is timed; a
failed check is printed and recorded, and its time is not reported.
--pipeline-timing adds, for custom, sdpa_flash and sdpa_cudnn, the pipeline's own timing of
the same shape in the same process (the kernel adapter the cells use, input sets rotated
past L2, one CUDA event pair per call, median; flashwatt.measure), so that the two methods
can be compared on one card at one time. --graph-timing adds a third: the same calls
captured in a CUDA graph and replayed, which takes the host's launch cost out of short
kernels.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys

SHAPES = [(32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
SEED = (16, 8, 1024, 64)


def _bench(fn, rep_ms: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=max(10, rep_ms // 4), rep=rep_ms, return_mode="median"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="CSV path for the measurements")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--max-seq-len", type=int, default=16384, help="leave out the shapes with longer sequences")
    ap.add_argument("--variants", action="store_true", help="also time every custom tile variant")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench measuring time per point")
    ap.add_argument("--pipeline-timing", action="store_true",
                    help="also time custom, sdpa_flash and sdpa_cudnn the way the pipeline's cells do")
    ap.add_argument("--graph-timing", action="store_true",
                    help="also time custom, sdpa_flash and sdpa_cudnn as CUDA-graph replays")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashwatt.build import build_info, load_extension
    from flashwatt.kernels.custom import TILES, WGMMA, WGMMA_CAPABILITY, flash_forward
    from flashwatt.measure import TOLERANCE

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    load_extension()
    info = build_info()
    print(f"device: {name}  torch {torch.__version__}  CUDA {torch.version.cuda}  build {info}", flush=True)

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    cases = []
    for D in (int(x) for x in args.head_dims.split(",")):
        for B, L in SHAPES:
            if L <= args.max_seq_len:
                cases.append((B, 2048 // D, L, D))
    if SEED not in cases and SEED[2] <= args.max_seq_len:
        cases.insert(0, SEED)

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    hopper = torch.cuda.get_device_capability(dev) == WGMMA_CAPABILITY
    backends = {
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),  # first: the reference output of the checks
        "custom": lambda q, k, v, causal: flash_forward(q, k, v, causal)[0],
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    rows = []
    failed_checks = 0
    header = (f"{'dtype':5} {'B':>3} {'H':>3} {'L':>6} {'D':>4} {'mask':6} {'custom':>8} {'flash':>8} {'cudnn':>8} "
              f"{'cust/fl':>8} {'cust/cu':>8}" + (f" {'wgmma':>8} {'wg/fl':>6} {'wg/cu':>6}" if hopper else ""))
    print(header)
    print("-" * len(header), flush=True)
    for dname in args.dtypes.split(","):
        dt = dtypes[dname]
        for B, H, L, D in cases:
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(B * 131 + L + D)
                q, k, v = (torch.randn((B, H, L, D), generator=g, device=dev, dtype=torch.float32).to(dt) for _ in range(3))
                flops = 4.0 * B * H * L * L * D / (2 if causal else 1)
                result = {}
                runs = dict(backends)
                for tname, tile in TILES.items():
                    if D in tile.head_dims and dname in tile.precisions and (args.variants or (hopper and tile.mma == WGMMA)):
                        runs[f"custom:{tname}"] = (lambda tn: lambda q, k, v, c: flash_forward(q, k, v, c, tn)[0])(tname)
                reference = None
                for kname, fn in runs.items():
                    err_vs_flash = math.nan
                    try:
                        out = fn(q, k, v, causal)
                        torch.cuda.synchronize()
                        if kname == "sdpa_flash":
                            reference = out.float()
                        elif kname.startswith("custom"):
                            if reference is None:
                                raise RuntimeError("no sdpa_flash output to check it against: not timed")
                            err_vs_flash = ((out.float() - reference).norm() / reference.norm()).item()
                            tol = TOLERANCE[dname]["fwd"]
                            if not err_vs_flash <= tol:
                                raise RuntimeError(f"output differs from sdpa_flash by {err_vs_flash:.2e} (> {tol:.0e})")
                        del out
                        ms = _bench(lambda: fn(q, k, v, causal), args.rep_ms)
                        tf = flops / ms / 1e9
                    except Exception as err:  # a refused shape or a failed check is a result, not a crash
                        failed_checks += kname.startswith("custom")
                        print(f"  {kname} failed on {dname} {B}x{H}x{L}x{D} causal={causal}: {str(err).splitlines()[0][:160]}", file=sys.stderr)
                        ms, tf = math.nan, math.nan
                    result[kname] = tf
                    kernel, _, variant = kname.partition(":")
                    rows.append(dict(device=name, dtype=dname, batch=B, heads=H, seq_len=L, head_dim=D, causal=causal,
                                     kernel=kernel, variant=variant, ms=round(ms, 5), tflops=round(tf, 2),
                                     rel_err_vs_flash=err_vs_flash))
                methods = [m for m, on in (("pipeline", args.pipeline_timing), ("graph", args.graph_timing)) if on]
                for method in methods:
                    for kname in ("sdpa_flash", "custom", "sdpa_cudnn"):
                        ms = math.nan
                        if result[kname] == result[kname]:  # timed (and, for custom, checked) above
                            try:
                                ms = _method_ms(method, kname, dname, B, H, L, D, causal)
                            except Exception as err:  # e.g. a backend that cannot be captured in a graph
                                print(f"  {method} timing of {kname} failed: {str(err).splitlines()[0][:160]}",
                                      file=sys.stderr)
                        tf = flops / ms / 1e9
                        result[f"{method}:{kname}"] = tf
                        rows.append(dict(device=name, dtype=dname, batch=B, heads=H, seq_len=L, head_dim=D,
                                         causal=causal, kernel=kname, variant=f"{method}_timing", ms=round(ms, 5),
                                         tflops=round(tf, 2), rel_err_vs_flash=math.nan))
                ratio = result["custom"] / result["sdpa_flash"] if result["sdpa_flash"] else math.nan
                ratio_cu = result["custom"] / result["sdpa_cudnn"] if result["sdpa_cudnn"] else math.nan
                line = (f"{dname:5} {B:>3} {H:>3} {L:>6} {D:>4} {'causal' if causal else 'full':6} "
                        f"{result['custom']:8.1f} {result['sdpa_flash']:8.1f} {result['sdpa_cudnn']:8.1f} {ratio:8.3f} "
                        f"{ratio_cu:8.3f}")
                if hopper:
                    wg = max((v for n, v in result.items() if n.startswith("custom:wgmma") and v == v), default=math.nan)
                    line += f" {wg:8.1f} {wg / result['sdpa_flash']:6.3f} {wg / result['sdpa_cudnn']:6.3f}"
                for method in methods:
                    pf, pc = result[f"{method}:sdpa_flash"], result[f"{method}:custom"]
                    line += f"   {method}: custom {pc:.1f} flash {pf:.1f} ratio {pc / pf:.3f}"
                if args.variants:
                    best = max(((v, n) for n, v in result.items() if n.startswith("custom:") and v == v), default=None)
                    if best:
                        line += f"   best tile {best[1][7:]} {best[0]:.1f}"
                print(line, flush=True)
                del q, k, v
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {len(rows)} rows to {args.out}")
    if failed_checks:
        print(f"{failed_checks} custom runs failed (above): their times are not reported", file=sys.stderr)
    return 1 if failed_checks else 0


def _method_ms(method: str, kname: str, precision: str, B: int, H: int, L: int, D: int, causal: bool) -> float:
    """Median ms of one call through the kernel adapter the cells use, input sets rotated past L2.
    pipeline: one CUDA event pair per call (flashwatt.measure, default settings);
    graph: 20 calls captured in a CUDA graph, each replay timed, per-call median."""
    import statistics

    import torch

    from flashwatt import measure
    from flashwatt.cell import Cell
    from flashwatt.kernels import get_kernel

    dev = torch.device("cuda")
    cell = Cell("bench", kname, precision, L, B, H, D, causal)
    kernel = get_kernel(kname)
    inputs = measure.make_inputs(cell, dev, 0, measure.input_sets_needed(cell, dev))
    call = measure.make_call(kernel, cell, inputs)
    with torch.no_grad():
        per_call_s = measure.warm_up(call, dev, 200)
        if method == "pipeline":
            timing = measure.time_calls(call, dev, per_call_s, {"min_time_ms": 500, "min_repeats": 30, "max_repeats": 2000})
            return timing["median_ms"]
        calls = 20
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # allocations the capture will reuse
            for i in range(3):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                call(i)
        graph.replay()
        torch.cuda.synchronize()
        replays = max(5, min(200, int(0.5 / max(per_call_s * calls, 1e-6))))
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
        del graph
        return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())
