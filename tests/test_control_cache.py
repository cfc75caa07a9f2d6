"""The warm-start cache of the power-aware controller (flashwatt.control.warm_start): what it
keeps, when it is invalid, that concurrent jobs lose nothing, how it is cleared, and that a
second run starts at its operating point (on the simulated GPU of tests/control_plant.py)."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from control_plant import CUDNN, IDLE_W, LIMIT_W, PROFILES, SHAPE, Plant, run
from flashwatt.control.governor import Governor
from flashwatt.control.model import PowerTable, Stats
from flashwatt.control.summary import front_at
from flashwatt.control.warm_start import CACHE_VARIABLE, WarmStartCache, cache_root, clear, list_entries

KEY = {"gpu": "Simulated H100", "uuid": "GPU-0000", "driver": "580.1", "kernels": "abc", "torch": "2.11"}
OTHER_SHAPE = ((64, 8, 512, 64), (64, 8, 512, 64), False, "bf16")


def learned(tokens_per_s: float = 17e6, shape: tuple = SHAPE) -> dict:
    stats = Stats(s_per_call=16384 / tokens_per_s, latency_samples=5, tokens_per_call=16384, eta=2e4, eta_samples=4)
    return {shape: {"stats": {CUDNN.label: stats}, "power": {CUDNN.label: PowerTable({10: 400.0, 20: 690.0})},
                    "refused": {"sdpa_flash": "head dim 512 is not supported"}}}


def test_what_a_run_learned_comes_back_by_shape(tmp_path):
    WarmStartCache(tmp_path, KEY).save(learned())
    entry = WarmStartCache(tmp_path, KEY).lookup(SHAPE)
    assert entry["stats"][CUDNN.label].tokens_per_s_full == pytest.approx(17e6)
    assert entry["power"][CUDNN.label].bins == {10: 400.0, 20: 690.0}
    assert entry["refused"] == {"sdpa_flash": "head dim 512 is not supported"} and entry["runs"] == 1
    assert WarmStartCache(tmp_path, KEY).lookup(OTHER_SHAPE) is None  # another shape (or precision) is its own entry
    fp16 = (SHAPE[0], SHAPE[1], SHAPE[2], "fp16")
    assert WarmStartCache(tmp_path, KEY).lookup(fp16) is None


@pytest.mark.parametrize("changed", ["driver", "kernels", "torch", "uuid"])
def test_a_new_driver_or_build_invalidates_what_was_learned(tmp_path, changed):
    WarmStartCache(tmp_path, KEY).save(learned())
    new_key = dict(KEY, **{changed: "something else"})
    fresh = WarmStartCache(tmp_path, new_key)
    assert fresh.lookup(SHAPE) is None
    fresh.save(learned(shape=OTHER_SHAPE))
    if changed == "uuid":  # another GPU of the same model: its own file, the first one's stays valid
        assert WarmStartCache(tmp_path, KEY).lookup(SHAPE) is not None
        return
    # the same GPU under a new driver or build: the old file is removed
    assert [p.name for p in fresh.folder.glob("*.json")] == [fresh.path.name]
    assert WarmStartCache(tmp_path, KEY).lookup(SHAPE) is None


def test_a_save_merges_configurations_and_counts_runs(tmp_path):
    cache = WarmStartCache(tmp_path, KEY)
    cache.save(learned(17e6))
    other = Stats(s_per_call=0.002, latency_samples=3, tokens_per_call=16384)
    WarmStartCache(tmp_path, KEY).save({SHAPE: {"stats": {"custom": other}, "power": {}}})
    entry = WarmStartCache(tmp_path, KEY).lookup(SHAPE)
    assert set(entry["stats"]) == {CUDNN.label, "custom"} and entry["runs"] == 2


def _save_many(root: str, worker: int, rounds: int) -> None:
    for i in range(rounds):
        shape = ((worker + 1, 8, 128 * (i + 1), 64), (worker + 1, 8, 128 * (i + 1), 64), False, "bf16")
        WarmStartCache(root, KEY).save(learned(shape=shape))


def _read_many(root: str, path: str, seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if Path(path).exists():
            json.loads(Path(path).read_text())  # never half a file: raises on a torn read


def test_concurrent_jobs_lose_no_update_and_never_show_half_a_file(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    path = WarmStartCache(tmp_path, KEY).path
    reader = ctx.Process(target=_read_many, args=(str(tmp_path), str(path), 6.0))
    writers = [ctx.Process(target=_save_many, args=(str(tmp_path), w, 8)) for w in range(4)]
    reader.start()
    for process in writers:
        process.start()
    for process in [*writers, reader]:
        # Their work is bounded (eight saves, six seconds of reads); the join's bound only
        # guards against a deadlock, far past what a loaded machine takes to start them.
        process.join(timeout=600)
        assert process.exitcode == 0, f"{process.name}: exit code {process.exitcode} (None: still running)"
    shapes = WarmStartCache(tmp_path, KEY).shapes()
    assert len(shapes) == 4 * 8  # every worker's every shape survived the others' saves


def test_clearing_removes_every_file_and_the_cli_says_where(tmp_path):
    WarmStartCache(tmp_path, KEY).save(learned())
    WarmStartCache(tmp_path, dict(KEY, uuid="GPU-1111")).save(learned())
    assert len(list_entries(tmp_path)) == 2
    env = {**os.environ, CACHE_VARIABLE: str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    shown = subprocess.run([sys.executable, "-m", "flashwatt.cli", "control-cache"], env=env, capture_output=True,
                           text=True)
    assert shown.returncode == 0 and f"control cache {tmp_path}: 2 file(s)" in shown.stdout
    cleared = subprocess.run([sys.executable, "-m", "flashwatt.cli", "control-cache", "--clear"], env=env,
                             capture_output=True, text=True)
    assert cleared.returncode == 0 and "removed 2 cache file(s)" in cleared.stdout
    assert list_entries(tmp_path) == [] and not list(tmp_path.glob("*/*.json"))
    assert clear(tmp_path) == 0


def test_the_cache_lives_where_the_variable_says_or_is_off(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "here"))
    assert cache_root() == tmp_path / "here"
    monkeypatch.setenv(CACHE_VARIABLE, "off")
    assert cache_root() is None
    monkeypatch.delenv(CACHE_VARIABLE)
    assert cache_root() == Path("results/control-cache").resolve()


def governor(budget: float, cache: WarmStartCache | None) -> Governor:
    return Governor("budget", list(PROFILES), budget_w=budget, idle_w=IDLE_W, limit_w=LIMIT_W, warm_start=cache)


def static_front(plant: Plant):
    import pandas as pd

    from control_plant import STEADY, oracle_rows

    return pd.DataFrame(oracle_rows(plant, STEADY))


@pytest.mark.parametrize("budget", [320.0, 450.0, 600.0])
def test_a_second_run_starts_at_its_operating_point(tmp_path, budget):
    plant = Plant(PROFILES)
    first = governor(budget, WarmStartCache(tmp_path, KEY))
    cold = run(first, plant, 8.0)
    first.warm_start.save(first.learned())
    second = governor(budget, WarmStartCache(tmp_path, KEY))
    warm = run(second, Plant(PROFILES, seed=1), 4.0)
    # (the first tick reads the board before any call; the first call starts warm)
    assert "warm start" in str(warm["event"].iloc[1]) and (warm["phase"] != "explore").all()
    assert second.shapes[SHAPE].warm and second.shapes[SHAPE].choice == CUDNN
    first_second = warm[warm["t"] <= 1.0]
    energy_j = first_second["true_energy_mj"].iloc[-1] / 1e3
    assert energy_j / first_second["t"].iloc[-1] <= budget  # its first second is within the budget
    tokens_per_s = first_second["tokens"].sum() / first_second["t"].iloc[-1]
    assert tokens_per_s >= 0.95 * front_at(static_front(plant), budget)  # ... and at its operating point
    cold_first = cold[cold["t"] <= 1.0]
    assert tokens_per_s > cold_first["tokens"].sum() / cold_first["t"].iloc[-1]  # where a cold start explores


def test_a_run_that_ends_exploring_leaves_the_next_one_less_to_explore(tmp_path):
    """A run shorter than an exploration saves its probe and the candidates it explored,
    marked partial; the next explores only the rest, without probing again, and once it
    has finished, the third starts at its operating point. Saved nothing, every such run
    began from nothing again (on an H200, 5 of 20 five-second runs in a row)."""
    first = governor(450.0, WarmStartCache(tmp_path, KEY))
    run(first, Plant(PROFILES), 1.5)
    assert first.shapes[SHAPE].exploring
    first.warm_start.save(first.learned())
    entry = WarmStartCache(tmp_path, KEY).lookup(SHAPE)
    assert entry["partial"] and entry["runs"] == 1
    second = governor(450.0, WarmStartCache(tmp_path, KEY))
    resumed = run(second, Plant(PROFILES, seed=1), 8.0)
    events = resumed["event"].dropna()
    assert events.iloc[0].startswith("warm start: explore 2 of 3 configurations on"), events.iloc[0]
    assert not events.str.startswith("prune").any()  # no second probe
    cold = run(governor(450.0, None), Plant(PROFILES, seed=1), 8.0)
    explored_until = resumed.loc[resumed["phase"] == "explore", "t"].max()
    assert explored_until < 0.6 * cold.loc[cold["phase"].isin(["probe", "explore"]), "t"].max()
    assert second.shapes[SHAPE].phase == "exploit"
    second.warm_start.save(second.learned())
    assert not WarmStartCache(tmp_path, KEY).lookup(SHAPE)["partial"]
    third = governor(450.0, WarmStartCache(tmp_path, KEY))
    warm = run(third, Plant(PROFILES, seed=2), 3.0)
    assert (warm["phase"] != "explore").all() and warm["event"].dropna().iloc[0].startswith("warm start: 4 configurations")
    # a run that ends exploring again leaves a whole entry whole
    fourth = governor(450.0, WarmStartCache(tmp_path, KEY))
    fourth.warm_start.save({SHAPE: dict(second.learned()[SHAPE], partial=True)})
    assert not WarmStartCache(tmp_path, KEY).lookup(SHAPE)["partial"]


def test_a_partial_save_keeps_what_the_file_measured_better(tmp_path):
    """A run that ended exploring may have only probed a configuration that the file knows at
    its operating point: the file keeps the better measured statistics and table; what the
    partial run measured better, it takes."""
    cache = WarmStartCache(tmp_path, KEY)
    cache.save(learned())  # cuDNN with 4 power samples and a table
    probed = Stats(s_per_call=16384 / 16e6, latency_samples=2, tokens_per_call=16384)
    cache.save({SHAPE: {"stats": {CUDNN.label: probed}, "power": {CUDNN.label: PowerTable({5: 300.0})},
                        "refused": {}, "partial": True}})
    entry = WarmStartCache(tmp_path, KEY).lookup(SHAPE)
    assert entry["stats"][CUDNN.label].eta_samples == 4 and not entry["partial"]
    assert entry["power"][CUDNN.label].bins == PowerTable({10: 400.0, 20: 690.0}).bins
    better = Stats(s_per_call=16384 / 16e6, latency_samples=6, tokens_per_call=16384, eta=2.1e4, eta_samples=9)
    cache.save({SHAPE: {"stats": {CUDNN.label: better}, "power": {}, "refused": {}, "partial": True}})
    assert WarmStartCache(tmp_path, KEY).lookup(SHAPE)["stats"][CUDNN.label].eta_samples == 9


def test_a_jobs_file_and_its_first_gpus_own_keep_each_other(tmp_path):
    """A job on several GPUs keeps its tables under rank 0's GPU in a folder of its own: a
    save removes the files of its folder's other keys (a new driver or build), so in one
    folder the job's save and the single GPU's would delete each other's."""
    root = tmp_path
    WarmStartCache(root, KEY).save(learned())
    WarmStartCache(root, dict(KEY, job_ranks=4)).save(learned(9e6))
    WarmStartCache(root, KEY).save(learned(18e6))
    assert len(list(root.rglob("*.json"))) == 2
    assert WarmStartCache(root, dict(KEY, job_ranks=4)).lookup(SHAPE) is not None
