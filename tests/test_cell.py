import re

import pytest

from flashwatt.attention.cell import WILDCARD_CONSTRAINTS, Cell


def cell(**kw):
    base = dict(suite="seed", kernel="naive", precision="fp16", seq_len=1024, batch=16, heads=8, head_dim=64)
    return Cell(**{**base, **kw})


@pytest.mark.parametrize("variant", ["", "q128_kv64_w8"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_path_round_trip(variant, causal, pass_):
    c = cell(kernel="custom", variant=variant, causal=causal, pass_=pass_)
    assert Cell.from_path(c.path) == c
    assert Cell.from_path("/abs/prefix/" + c.path) == c
    assert Cell.from_wildcards(**c.wildcards) == c
    for key, value in c.wildcards.items():
        assert re.fullmatch(WILDCARD_CONSTRAINTS[key], value), key


def test_derived_names_agree():
    c = cell()
    assert c.path == "results/cells/seed/naive/fp16/L1024-B16-H8-D64-full-fwd.json"
    assert c.trace_path == "results/cells/seed/naive/fp16/L1024-B16-H8-D64-full-fwd.trace.parquet"
    assert c.log_path == "results/logs/cells/seed/naive/fp16/L1024-B16-H8-D64-full-fwd.log"
    assert c.job_name == "fw-seed-naive-fp16-L1024-B16-H8-D64-full-fwd"
    assert c.as_row()["pass"] == "fwd" and c.as_row()["cell_id"] == c.id


def test_flops_follow_flash_attention_convention():
    c = cell()
    assert c.fwd_flops == 4 * 16 * 8 * 1024 * 1024 * 64
    assert cell(causal=True).flops == c.fwd_flops / 2
    assert cell(pass_="fwd_bwd").flops == pytest.approx(3.5 * c.fwd_flops)
    assert cell(causal=True, pass_="fwd_bwd").flops == pytest.approx(1.75 * c.fwd_flops)


@pytest.mark.parametrize("bad", [
    "results/cells/seed/naive/fp16/L1024-B16-H8-D64-full.json",
    "results/cells/seed/naive/fp64/L1024-B16-H8-D64-full-fwd.json",
    "results/other/seed/naive/fp16/L1024-B16-H8-D64-full-fwd.json",
    "results/cells/seed/naive/fp16/L1024-B16-H8-D64-full-fwd.txt",
])
def test_bad_paths_are_refused(bad):
    with pytest.raises(ValueError):
        Cell.from_path(bad)


@pytest.mark.parametrize("kw, word", [
    ({"seq_len": 0}, "seq_len"), ({"batch": -1}, "batch"), ({"precision": "fp64"}, "precision"),
    ({"pass_": "bwd"}, "pass"), ({"kernel": "Naive"}, "kernel"), ({"kernel": "flashy"}, "kernel='flashy': allowed naive"), ({"variant": "a-b"}, "variant"),
])
def test_invalid_cells_name_the_field(kw, word):
    with pytest.raises(ValueError, match=word):
        cell(**kw)
