"""Compiles kernels/flash_fwd.cu, kernels/flash_bwd.cu and kernels/flash_fp8.cu with nvcc for
sm_80 and sm_90a with the wgmma kernels (no GPU, no torch needed) and checks ptxas's
resource report: no register spills and no stack frame in any kernel, registers reported for
each, and no wgmma that ptxas had to serialise; and in the PTX, that 16-byte rows leave in one
store."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from support import find_nvcc

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]  # each build takes a minute or more of CPU

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def _nvcc() -> str:
    nvcc = find_nvcc()
    assert nvcc, "marker nvcc: tests/conftest.py fails this test before it runs without nvcc"
    return nvcc


def parse_ptxas(report: str) -> dict[str, dict[str, int]]:
    """kernel name -> {regs, stack, spill_stores, spill_loads} from `-Xptxas -v` output."""
    kernels: dict[str, dict[str, int]] = {}
    current = None
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            kernels[current] = {}
        elif current and (m := _FRAME.search(line)):
            kernels[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := _REGS.search(line)):
            kernels[current]["regs"] = int(m.group(1))
    return kernels


# The flags flashwatt.build uses for each capability (sm_90a: Hopper, with the wgmma kernels;
# plain sm_90 is built for no device, so it is not compiled here: 45 s of CPU for nothing).
ARCH_FLAGS = {
    "80": ["-gencode=arch=compute_80,code=sm_80"],
    "90a": ["-gencode=arch=compute_90a,code=sm_90a", "-DFLASHWATT_WGMMA"],
}
# The sm_90a builds (the wgmma kernels) take about 8 min of CPU, sm_80's 1.5 min: sm_90a's
# tests are in the heavy tier (`make test-heavy`), sm_80's keep nvcc and ptxas's report in
# `make test`.
ARCHS = [pytest.param("80"), pytest.param("90a", marks=pytest.mark.heavy)]
# ptxas notes that a wgmma pipeline was serialised or needed an injected fence (C7514,
# C7515, ..., C7519, C7520): each one costs the overlap the Hopper kernel is built for.
_WGMMA_SERIALISED = re.compile(r"\((C75(?:0\d|1\d|2\d))\)[^\n]*(?:wgmma|GMMA|warpgroup)[^\n]*")


class Build(NamedTuple):
    arch: str
    kernels: dict[str, dict[str, int]]  # parse_ptxas of the report
    report: str  # nvcc's and ptxas's output
    ptx: str  # the PTX ptxas was given (kept by --keep, not compiled a second time)


_BUILDS: dict[tuple[str, str], Build] = {}


def _compile(source: str, arch: str, tmp_path_factory) -> Build:
    """One nvcc run per source and architecture for the whole module: the ptxas report and
    the PTX both come from it (the sm_90a build takes minutes of CPU)."""
    if (source, arch) in _BUILDS:
        return _BUILDS[source, arch]
    folder = tmp_path_factory.mktemp(f"sm{arch}")
    out = folder / source.replace(".cu", ".o")
    cmd = [
        _nvcc(), "-O3", "-std=c++17", *ARCH_FLAGS[arch],
        "-Xptxas", "-v", "-c", str(KERNELS / source), "-o", str(out), "--keep", "--keep-dir", str(folder),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed on {source} for sm_{arch}:\n{proc.stdout}\n{proc.stderr}"
    report = proc.stdout + proc.stderr
    [ptx] = folder.glob(f"{Path(source).stem}*.ptx")
    _BUILDS[source, arch] = Build(arch, parse_ptxas(report), report, ptx.read_text())
    return _BUILDS[source, arch]


@pytest.fixture(scope="module", params=ARCHS)
def ptxas_report(request, tmp_path_factory):
    return _compile("flash_fwd.cu", request.param, tmp_path_factory)[:3]


@pytest.fixture(scope="module", params=ARCHS)
def bwd_ptxas_report(request, tmp_path_factory):
    return _compile("flash_bwd.cu", request.param, tmp_path_factory)[:3]


@pytest.fixture(scope="module", params=ARCHS)
def fp8_ptxas_report(request, tmp_path_factory):
    return _compile("flash_fp8.cu", request.param, tmp_path_factory)[:3]


def test_all_kernels_compiled(ptxas_report):
    arch, kernels, _ = ptxas_report
    tc = [k for k in kernels if "flash_fwd_tc_kernel" in k]
    f32 = [k for k in kernels if "flash_fwd_f32_kernel" in k]
    wg = [k for k in kernels if "flash_fwd_wgmma_kernel" in k]
    tf32 = [k for k in kernels if "flash_fwd_tf32_kernel" in k]
    ws = [k for k in kernels if "flash_fwd_wgmma_ws_kernel" in k]
    # 11 tile configurations x 2 half types, 3 head dims of fp32, 2 of tf32; 11 wgmma tiles x 2 half types
    # (7 lockstep, 4 ping-pong).
    assert len(tc) == 22, f"sm_{arch}: expected 22 tensor-core kernels, found {len(tc)}"
    assert len(f32) == 3, f"sm_{arch}: expected 3 fp32 kernels, found {len(f32)}"
    assert len(tf32) == 2, f"sm_{arch}: expected 2 tf32 kernels, found {len(tf32)}"
    assert len(wg) == (22 if arch == "90a" else 0), f"sm_{arch}: found {len(wg)} wgmma kernels"
    # Warp-specialised: the wgmma_ws_ tiles of custom_variants.TILES, per head dim, x 2 half types, x 2
    # ways to copy (TMA, the producer's threads).
    from flashwatt.kernels.custom_variants import TILES, WS_SCHEDULES

    n_ws = 4 * sum(len(t.head_dims) for t in TILES.values()
                   if t.schedule in WS_SCHEDULES and "fp8" not in t.precisions)  # (fp8's: flash_fp8.cu)
    tma = [k for k in ws if _WS_ARGS.search(k) and _WS_ARGS.search(k).group(6) == "1"]
    assert len(tma) == (n_ws // 2 if arch == "90a" else 0), f"sm_{arch}: found {len(tma)} warp-specialised kernels with TMA copies"
    assert len(ws) == (n_ws if arch == "90a" else 0), f"sm_{arch}: found {len(ws)} warp-specialised kernels"


_WS_ARGS = re.compile(r"flash_fwd_wgmma_ws_kernelI\w+?Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb([01])E")


def test_warp_specialized_register_budget(ptxas_report):
    """setmaxnreg in the warp-specialised kernels moves registers between warpgroups inside
    the CTA's allocation: with 2 consumers, 384 threads x 168 at launch = 128 x 24 (producer)
    + 256 x 240 (consumers); with 3, 512 x 128 = 128 x 32 + 384 x 160. With fewer at launch
    the consumers' setmaxnreg.inc would wait forever, so ptxas must report exactly the
    launch share (__launch_bounds__(128 * (NWG + 1), 1): 65536 / threads, in multiples of 8)."""
    arch, kernels, _ = ptxas_report
    ws = {name: info for name, info in kernels.items() if "flash_fwd_wgmma_ws_kernel" in name}
    assert (arch == "90a") == bool(ws)
    bad = {}
    consumers = set()
    for name, info in ws.items():
        m = _WS_ARGS.search(name)
        assert m, f"cannot read the template arguments (D, BN, NWG, ST, PP, TMA) of {name}"
        nwg = int(m.group(3))
        consumers.add(nwg)
        expected = {2: 168, 3: 128}[nwg]
        if info.get("regs") != expected:
            bad[name] = (info.get("regs"), expected)
    assert not bad, f"sm_{arch}: warp-specialised kernels not at their launch share (found, expected): {bad}"
    assert arch != "90a" or consumers == {2, 3}


def test_wgmma_never_serialised(ptxas_report):
    arch, _, report = ptxas_report
    found = [m.group(0) for m in _WGMMA_SERIALISED.finditer(report)]
    assert not found, f"sm_{arch}: ptxas serialised wgmma:\n" + "\n".join(found[:4])


def test_no_spills_no_stack(ptxas_report):
    arch, kernels, _ = ptxas_report
    bad = {
        name: info
        for name, info in kernels.items()
        if info.get("stack", -1) != 0 or info.get("spill_stores", -1) != 0 or info.get("spill_loads", -1) != 0
    }
    assert not bad, f"sm_{arch}: kernels with spills or a stack frame: {bad}"


def test_backward_kernels_compiled(bwd_ptxas_report):
    """Every row of FLASHWATT_BWD_CONFIGS (BWD_TILES) for fp16 and bf16, and the row kernels
    (delta and the dQ conversion) and the deterministic dQ pass per dtype and head dim, on
    every architecture."""
    from flashwatt.kernels.custom_backward import BWD_TILES

    arch, kernels, _ = bwd_ptxas_report
    main = [k for k in kernels if "flash_bwd_kernel" in k]
    wg = [k for k in kernels if "flash_bwd_wgmma_kernel" in k]
    ws = [k for k in kernels if "flash_bwd_wgmma_ws_kernel" in k]
    pre = [k for k in kernels if "flash_bwd_preprocess_kernel" in k]
    conv = [k for k in kernels if "flash_bwd_convert_dq_kernel" in k]
    dq_pass = [k for k in kernels if "flash_bwd_dq_kernel" in k]  # the deterministic mode's dQ
    tiles = sum(len(t.head_dims) for t in BWD_TILES.values() if t.math == "mma.sync")
    wg_tiles = sum(len(t.head_dims) for t in BWD_TILES.values() if t.math == "wgmma" and not t.warp_specialised)
    ws_tiles = sum(len(t.head_dims) for t in BWD_TILES.values() if t.warp_specialised)
    head_dims = {D for t in BWD_TILES.values() for D in t.head_dims}
    assert len(main) == 2 * tiles, f"sm_{arch}: expected {2 * tiles} backward kernels, found {len(main)}"
    expected_wg = 2 * wg_tiles if arch == "90a" else 0
    assert wg_tiles and len(wg) == expected_wg, f"sm_{arch}: expected {expected_wg} wgmma backward kernels: {wg}"
    expected_ws = 2 * ws_tiles if arch == "90a" else 0
    assert ws_tiles and len(ws) == expected_ws, f"sm_{arch}: expected {expected_ws} warp-specialised kernels: {ws}"
    assert len(pre) == len(conv) == len(dq_pass) == 2 * len(head_dims), f"sm_{arch}: row kernels {pre} {conv} {dq_pass}"


def test_backward_warp_specialised_register_budget(bwd_ptxas_report, tmp_path_factory):
    """The warp-specialised backward (flash_bwd_wgmma_ws.cuh) moves registers between its
    warpgroups with setmaxnreg inside the CTA's allocation: 384 threads x 168 at launch, the
    producer down to 24, the two consumers up to 240 (128 x 24 + 256 x 240 = 64512 of 65536).
    ptxas must report exactly the launch share (with fewer the consumers' setmaxnreg.inc would
    wait forever), and the PTX must ask for those two counts; the consumers' code fitting in
    240 shows as no spill (test_backward_no_spills_no_stack)."""
    arch, kernels, _ = bwd_ptxas_report
    ws = {name: info for name, info in kernels.items() if "flash_bwd_wgmma_ws_kernel" in name}
    assert (arch == "90a") == bool(ws), sorted(ws)
    assert all(info.get("regs") == 168 for info in ws.values()), {k: v.get("regs") for k, v in ws.items()}
    bodies = {name: body for name, body in _ptx_entries("flash_bwd.cu", arch, tmp_path_factory).items() if name in ws}
    assert sorted(bodies) == sorted(ws)
    for name, body in bodies.items():
        dec = re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32 (\d+);", body)
        inc = re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+);", body)
        assert (dec, inc) == (["24"], ["240"]), (name, dec, inc)
        assert 128 * int(dec[0]) + 256 * int(inc[0]) <= 65536 and int(inc[0]) >= 168 >= int(dec[0])


def test_backward_wgmma_never_serialised(bwd_ptxas_report):
    arch, _, report = bwd_ptxas_report
    found = [m.group(0) for m in _WGMMA_SERIALISED.finditer(report)]
    assert not found, f"sm_{arch}: ptxas serialised wgmma in the backward:\n" + "\n".join(found[:4])


def test_backward_no_spills_no_stack(bwd_ptxas_report):
    arch, kernels, _ = bwd_ptxas_report
    bad = {
        name: info
        for name, info in kernels.items()
        if info.get("stack", -1) != 0 or info.get("spill_stores", -1) != 0 or info.get("spill_loads", -1) != 0
    }
    assert kernels and not bad, f"sm_{arch}: backward kernels with spills or a stack frame: {bad}"


def test_binding_formats_its_messages_without_a_stream():
    """kernels/flash_binding.cpp refuses through FLASHWATT_CHECK, whose message is one string
    made with std::to_string: TORCH_CHECK given several pieces formats them in an ostringstream
    of the extension, and a number in it crashed the process on the GPU image instead of
    raising. TORCH_CHECK appears once, in the macro."""
    text = re.sub(r"//.*", "", (KERNELS / "flash_binding.cpp").read_text())
    assert text.count("TORCH_CHECK(") == 1 and "#define FLASHWATT_CHECK(cond, ...) TORCH_CHECK(cond, message::cat(" in text
    assert "<<" not in text and "stringstream" not in text


def test_header_is_torch_free():
    text = "".join(p.read_text() for p in sorted(KERNELS.glob("*.cu*")))
    assert "torch" not in re.sub(r"//.*", "", text), "the .cu/.cuh kernel sources must not include torch headers"


_PTX_ENTRY = re.compile(r"^(?:\.visible )?\.entry (\S+)\(", re.M)


def _ptx_entries(source: str, arch: str, tmp_path_factory) -> dict[str, str]:
    """kernel name -> its PTX body, for the build of source for sm_{arch}."""
    text = _compile(source, arch, tmp_path_factory).ptx
    marks = list(_PTX_ENTRY.finditer(text))
    return {m.group(1): text[m.start():(marks[i + 1].start() if i + 1 < len(marks) else len(text))]
            for i, m in enumerate(marks)}


@pytest.mark.parametrize("arch", ARCHS)
def test_sixteen_byte_rows_leave_in_one_store(arch, tmp_path_factory):
    """The forward's O rows and the backward's converted dQ rows go to global memory in
    16-byte stores. nvcc splits `*reinterpret_cast<uint4*>(p) = v` into four 32-bit stores
    when v's words come from inline asm, which cost the forward 3-6 % at 1024-2048 keys on an
    H100 (kernels/NOTES.md, "O in 16-byte stores")."""
    fwd = _ptx_entries("flash_fwd.cu", arch, tmp_path_factory)
    half = {name: body for name, body in fwd.items() if "I6__half" in name or "I13__nv_bfloat16" in name}
    assert half, sorted(fwd)
    split = sorted(name for name, body in half.items() if "st.global.u32" in body)
    assert not split, f"forward kernels storing O in 32-bit pieces: {split[:3]}"
    assert all("st.global.v4.b32" in body for body in half.values())
    bwd = _ptx_entries("flash_bwd.cu", arch, tmp_path_factory)
    convert = {name: body for name, body in bwd.items() if "convert_dq" in name}
    assert len(convert) >= 2, sorted(bwd)
    for name, body in convert.items():
        assert "st.global.v4.b32" in body and "st.global.u32" not in body, name


# ---------------------------------------------------------------- fp8 (kernels/flash_fp8.cu)

def test_fp8_kernels_compiled_for_sm90a_only(fp8_ptxas_report):
    """Every fp8 tile of custom_variants.TILES at each of its head dims, for a bf16 and an fp16
    output; the quantisation (bf16, fp16 inputs and an e4m3 V: one kernel each) at head dims
    64 and 128. Elsewhere the translation unit compiles with none (the launches refuse)."""
    from flashwatt.kernels.custom_variants import TILES

    from flashwatt.kernels.custom_variants import WS_SCHEDULES

    arch, kernels, _ = fp8_ptxas_report
    fwd = [k for k in kernels if "flash_fwd_fp8_kernel" in k]
    ws = [k for k in kernels if "flash_fwd_fp8_ws_kernel" in k]
    quant = [k for k in kernels if "fp8_quantize_kernel" in k]
    fp8 = [t for t in TILES.values() if "fp8" in t.precisions]
    tiles = sum(len(t.head_dims) for t in fp8 if t.schedule not in WS_SCHEDULES)
    ws_tiles = sum(len(t.head_dims) for t in fp8 if t.schedule in WS_SCHEDULES)
    hopper = arch == "90a"
    assert len(fwd) == (2 * tiles if hopper else 0), f"sm_{arch}: fp8 kernels {fwd}"
    assert len(ws) == (2 * ws_tiles if hopper else 0), f"sm_{arch}: warp-specialised fp8 kernels {ws}"
    assert len(quant) == (6 if hopper else 0), f"sm_{arch}: {quant}"
    assert all("regs" in kernels[k] for k in fwd + ws + quant), "ptxas reported no register count"
    # setmaxnreg moves registers inside the CTA's allocation: 384 threads x 168 at launch =
    # 128 x 24 (producer) + 256 x 240 (consumers), with three consumers 512 x 128 = 128 x 32 +
    # 384 x 160; fewer at launch and the consumers' inc waits forever
    consumers = {k: int(re.search(r"Li(?:64|128)ELi128ELi(\d)E", k).group(1)) for k in ws}
    assert sorted(set(consumers.values())) == ([2, 3] if hopper else []), consumers
    assert all(kernels[k]["regs"] == {2: 168, 3: 128}[consumers[k]] for k in ws), {k: kernels[k]["regs"] for k in ws}


def test_fp8_no_spills_no_stack_no_serialised_wgmma(fp8_ptxas_report):
    arch, kernels, report = fp8_ptxas_report
    bad = {name: info for name, info in kernels.items()
           if info.get("stack", -1) != 0 or info.get("spill_stores", -1) != 0 or info.get("spill_loads", -1) != 0}
    assert not bad, f"sm_{arch}: fp8 kernels with spills or a stack frame: {bad}"
    found = [m.group(0) for m in _WGMMA_SERIALISED.finditer(report)]
    assert not found, f"sm_{arch}: ptxas serialised the fp8 wgmma:\n" + "\n".join(found[:4])
    # one CTA of 2 warpgroups per SM: 65536 registers over 256 threads at most
    assert all(info["regs"] <= 255 for name, info in kernels.items() if "flash_fwd_fp8_kernel" in name)
