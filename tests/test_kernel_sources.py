"""Compiles kernels/flash_fwd.cu with nvcc for sm_80 and sm_90 (no GPU, no torch needed) and
checks ptxas's resource report: no register spills and no stack frame in any kernel."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def _nvcc() -> str:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("nvcc not found on PATH (nor /usr/local/cuda/bin/nvcc): this test compiles the CUDA kernels and needs it")


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


@pytest.fixture(scope="module", params=["80", "90"])
def ptxas_report(request, tmp_path_factory):
    arch = request.param
    out = tmp_path_factory.mktemp(f"sm{arch}") / "flash_fwd.o"
    cmd = [
        _nvcc(), "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-Xptxas", "-v", "-c", str(KERNELS / "flash_fwd.cu"), "-o", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed for sm_{arch}:\n{proc.stdout}\n{proc.stderr}"
    return arch, parse_ptxas(proc.stdout + proc.stderr)


def test_all_kernels_compiled(ptxas_report):
    arch, kernels = ptxas_report
    tc = [k for k in kernels if "flash_fwd_tc_kernel" in k]
    f32 = [k for k in kernels if "flash_fwd_f32_kernel" in k]
    # 11 tile configurations x 2 half types, 3 head dims of fp32.
    assert len(tc) == 22, f"sm_{arch}: expected 22 tensor-core kernels, found {len(tc)}"
    assert len(f32) == 3, f"sm_{arch}: expected 3 fp32 kernels, found {len(f32)}"


def test_no_spills_no_stack(ptxas_report):
    arch, kernels = ptxas_report
    bad = {
        name: info
        for name, info in kernels.items()
        if info.get("stack", -1) != 0 or info.get("spill_stores", -1) != 0 or info.get("spill_loads", -1) != 0
    }
    assert not bad, f"sm_{arch}: kernels with spills or a stack frame: {bad}"


def test_registers_fit(ptxas_report):
    arch, kernels = ptxas_report
    for name, info in kernels.items():
        assert 0 < info["regs"] <= 255, f"sm_{arch}: {name} uses {info['regs']} registers"


def test_header_is_torch_free():
    text = (KERNELS / "flash_fwd.cu").read_text() + (KERNELS / "flash_fwd.cuh").read_text()
    assert "torch" not in re.sub(r"//.*", "", text), "flash_fwd.cu/.cuh must not include torch headers"
