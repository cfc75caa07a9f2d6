"""flashwatt.kernel_profile's summary of Nsight Compute's SASS source page: a kernel's warp
samples by kind of instruction and stall reason, on an export written here in ncu's format
(the first line names the kernel, then one quoted row per instruction)."""
from __future__ import annotations

import csv

import pytest

from flashwatt.kernel_profile import by_opcode, hottest, main, read_sass_page

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_wait", "stall_long_sb", "stall_barrier", "stall_selected"]
# (source, samples, executed, wait, long scoreboard, barrier, selected)
ROWS = [
    ("      MUFU.EX2 R90, R90", 300, 1000, 240, 0, 0, 60),
    ("      MUFU.EX2 R91, R91", 100, 1000, 80, 0, 0, 20),
    ("      @!P0  BRA 0x7f10", 200, 50, 0, 190, 0, 10),
    ("      FFMA R1, R2, R3, -R4", 150, 2000, 30, 0, 0, 120),
    ("      WARPGROUP.DEPBAR.LE gsb0, 0x1", 250, 20, 0, 0, 240, 10),
    ("      @P1 FFMA R5, R6, R7, R8", 0, 0, 0, 0, 0, 0),
]


def write_export(path, rows=ROWS, kernel="void flashwatt::k<(int)128>(flashwatt::P)"):
    with path.open("w", newline="") as f:
        f.write(f'"Kernel Name","{kernel}",\n')
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(HEADER)
        for i, (source, samples, executed, wait, long_sb, barrier, selected) in enumerate(rows):
            w.writerow([f"0x7f{i:04x}", source, f"{samples:,}", samples, executed, wait, long_sb, barrier, selected])
    return path


def test_samples_add_up_by_opcode_without_predicates_or_modifiers(tmp_path):
    kernel, frame = read_sass_page(write_export(tmp_path / "p.csv"))
    assert kernel.startswith("void flashwatt::k")
    table = by_opcode(frame)
    assert list(table.index) == ["MUFU", "WARPGROUP", "BRA", "FFMA"]
    assert table.loc["MUFU", "samples"] == 400 and table.loc["MUFU", "executed"] == 2000
    assert table.loc["FFMA", "samples"] == 150 and table.loc["FFMA", "executed"] == 2000  # the predicated one too
    assert table["share_pct"].sum() == pytest.approx(100.0)
    assert table.loc["MUFU", "share_pct"] == pytest.approx(40.0)
    assert table.loc["MUFU", "wait_pct"] == pytest.approx(80.0)
    assert table.loc["BRA", "long_sb_pct"] == pytest.approx(95.0)
    assert table.loc["WARPGROUP", "barrier_pct"] == pytest.approx(96.0)


def test_the_hottest_instructions_come_first_with_their_share(tmp_path):
    _, frame = read_sass_page(write_export(tmp_path / "p.csv"))
    top = hottest(frame, 2)
    assert list(top["Source"]) == ["MUFU.EX2 R90, R90", "WARPGROUP.DEPBAR.LE gsb0, 0x1"]
    assert list(top["share_pct"]) == pytest.approx([30.0, 25.0])


def test_a_file_that_is_not_an_export_or_holds_no_samples_is_named(tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("Address,Source\n0x1,NOP\n")
    assert main(["summary", str(other)]) == 2
    assert "other.csv: not an ncu source-page export" in capsys.readouterr().err
    empty = write_export(tmp_path / "empty.csv", rows=[("      NOP", 0, 10, 0, 0, 0, 0)])
    assert main(["summary", str(empty)]) == 2
    assert "no warp samples" in capsys.readouterr().err


def test_the_summary_prints_the_kernel_the_table_and_the_hottest(tmp_path, capsys):
    assert main(["summary", str(write_export(tmp_path / "p.csv")), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("void flashwatt::k<(int)128>(flashwatt::P): 1000 warp samples")
    assert "MUFU" in out and "the 3 instructions with the most samples" in out


def test_run_names_a_bad_shape_and_a_machine_without_a_gpu(monkeypatch):
    import torch

    with pytest.raises(SystemExit, match="shape '4x16x4096': expected BxHxLxD"):
        main(["run", "4x16x4096"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device here"):
        main(["run", "1x1x64x64"])


def test_run_refuses_a_backward_it_has_not_got(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(SystemExit, match="fp8 has a forward only"):
        main(["run", "1x1x64x64", "--precision", "fp8", "--pass", "bwd"])
    with pytest.raises(SystemExit, match="unknown custom backward tile 'nope'"):
        main(["run", "1x1x64x64", "--pass", "bwd", "--bwd-tile", "nope"])
