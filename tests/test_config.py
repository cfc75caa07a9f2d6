import copy

import pytest
import yaml

from flashwatt.attention.suite import suite_cells
from flashwatt.config import ConfigError, load_config, resolve_suite, validate_config

BASE = yaml.safe_load(open("config/config.yaml"))


def with_change(change):
    config = copy.deepcopy(BASE)
    change(config)
    return config


def grid(config, suite="smoke"):
    return config["suites"][suite]["grids"][0]


@pytest.mark.parametrize("change, message", [
    (lambda c: grid(c)["kernels"].append("flashy"),
     r"suites\.smoke\.grids\[0\]\.kernels\[2\]: 'flashy' is not allowed; allowed: naive, sdpa_math"),
    (lambda c: grid(c).__setitem__("seq_lens", [0]), r"suites\.smoke\.grids\[0\]\.seq_lens\[0\]: 0 is less than the minimum of 1"),
    (lambda c: grid(c).__setitem__("head_dims", [48]), r"head_dims\[0\]: 48 is not allowed; allowed: 16, 32, 64, 128, 256"),
    (lambda c: grid(c).__setitem__("precisions", ["fp4"]), r"precisions\[0\]: 'fp4' is not allowed; allowed: fp32, tf32, fp16, bf16, fp8"),
    (lambda c: c["measure"].__setitem__("warmup", 5), r"config key measure: unknown key\(s\) 'warmup'; allowed: .*warmup_ms"),
    (lambda c: c.__setitem__("suit", "seed"), r"config key \(top level\): unknown key\(s\) 'suit'"),
    (lambda c: grid(c).__setitem__("tokens_per_batch", 1024), r"give exactly one of batches or tokens_per_batch"),
    (lambda c: c.__setitem__("executor", "pbs"), r"config key executor: 'pbs' is not allowed; allowed: local, slurm, inprocess"),
    (lambda c: grid(c).__setitem__("variants", ["", "wgmma_m128_n128"]),
     r"suites\.smoke\.grids\[0\]\.variants\[1\]: unknown custom variant 'wgmma_m128_n128'; allowed: .*wgmma_m128_n128_s2"),
    (lambda c: grid(c).__setitem__("variants", ["sm0"]), r"variants\[0\]: custom variant 'sm0': CTA caps must be at least 1"),
    (lambda c: c.__setitem__("retry_failed", "yes"), r"config key retry_failed: 'yes' is not allowed; give true, false or a list"),
    (lambda c: c.__setitem__("retry_failed", ["error", "ok"]),
     r"config key retry_failed\[1\]: 'ok' is not allowed; allowed: incorrect, oom, error, diverged, job_failed"),
])
def test_bad_values_name_key_and_allowed_values(change, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_change(change))


def test_unknown_suite_names_the_allowed_ones():
    config = validate_config(with_change(lambda c: c.__setitem__("suite", "seeed")))
    with pytest.raises(ConfigError, match="config key suite: unknown suite 'seeed'; allowed: auto, smoke, seed, sweep"):
        resolve_suite(config)


def test_auto_suite_follows_visible_gpus(monkeypatch):
    config = load_config()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_suite(config) == "smoke"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert resolve_suite(config) == "seed"


def test_defaults_are_filled(tmp_path):
    # A config that leaves out the measure block and a grid's optional keys gets the schema's defaults.
    (tmp_path / "c.yaml").write_text(
        "suites:\n  s:\n    grids:\n      - {kernels: [naive], precisions: [fp32], seq_lens: [8],"
        " batches: [1], heads: [1], head_dims: [16]}\n")
    config = load_config(tmp_path / "c.yaml")
    assert config["measure"]["energy_window_s"] == 3.0 and config["measure"]["cuda_graph"] is True
    assert config["suite"] == "auto" and config["executor"] == "local" and config["filter"] == ""
    g = config["suites"]["s"]["grids"][0]
    assert g["variants"] == [""] and g["causal"] == [False] and g["passes"] == ["fwd"]


def test_seed_suite_is_the_seed_study():
    """The seed study (B16 H8 D64, L 512 and 1024, every kernel), and the fp8 rung beside our bf16
    forward: at the seed shapes, and at D128 with 4096 keys (tests/test_fp8_precision.py)."""
    cells = suite_cells(load_config(), "seed")
    ladder = [c for c in cells if c.head_dim == 128]
    study = [c for c in cells if c.head_dim != 128 and c.precision != "fp8"]
    assert {(c.batch, c.heads, c.head_dim) for c in study} == {(16, 8, 64)}
    assert {c.seq_len for c in study} == {512, 1024}
    assert {c.precision for c in study} == {"fp32", "fp16", "bf16"}
    forward = [c for c in study if c.pass_ == "fwd"]
    assert len(forward) == 6 * 3 * 2
    backward = [c for c in study if c.pass_ == "fwd_bwd"]
    assert {c.kernel for c in backward} == {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "custom"}
    assert len(backward) == 4 * 2 * 2
    assert {(c.kernel, c.precision, c.batch, c.heads, c.seq_len) for c in ladder} == {
        ("custom", "bf16", 4, 16, 4096), ("custom", "fp8", 4, 16, 4096)}
    assert {(c.batch, c.heads, c.seq_len) for c in cells if c.precision == "fp8" and c.head_dim == 64} == {
        (16, 8, 512), (16, 8, 1024)}


def test_sweep_follows_flash_attention_convention():
    cells = suite_cells(load_config(), "sweep")
    convention = [c for c in cells if c.heads * c.head_dim == 2048]
    assert convention and all(c.batch * c.seq_len == 16384 for c in convention)
    assert {c.seq_len for c in cells} == {2**k for k in range(7, 15)}
    assert {c.batch for c in cells if c.heads * c.head_dim == 512} == {16, 32, 64, 128}


def test_filter_selects_a_slice_and_rejects_nonsense():
    config = load_config(overrides={"filter": "kernel == 'naive' and seq_len >= 4096"})
    cells = suite_cells(config, "sweep")
    assert cells and all(c.kernel == "naive" and c.seq_len >= 4096 for c in cells)
    bad = load_config(overrides={"filter": "kernal == 'naive'"})
    with pytest.raises(ConfigError, match="config key filter"):
        suite_cells(bad, "sweep")


def test_tokens_per_batch_must_divide():
    config = with_change(lambda c: c["suites"]["sweep"]["grids"][1].__setitem__("seq_lens", [3000]))
    with pytest.raises(ConfigError, match=r"tokens_per_batch: 16384 is not a multiple of seq_len 3000"):
        suite_cells(validate_config(config), "sweep")


def test_the_workflow_schema_is_the_packaged_one():
    from support import REPO

    linked = REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert linked.is_symlink() and linked.resolve() == REPO / "src" / "flashwatt" / "config.schema.yaml"


def test_schema_enums_come_from_the_vocabulary():
    from flashwatt import vocabulary
    from flashwatt.config import SCHEMA, load_schema

    raw = SCHEMA.read_text()
    assert "sdpa_cudnn" not in raw and "fwd_bwd" not in raw  # the YAML does not repeat the lists
    grid = load_schema()["properties"]["suites"]["additionalProperties"]["properties"]["grids"]["items"]["properties"]
    assert tuple(grid["kernels"]["items"]["enum"]) == vocabulary.KERNEL_NAMES
    assert tuple(grid["precisions"]["items"]["enum"]) == vocabulary.PRECISIONS
    assert tuple(grid["passes"]["items"]["enum"]) == vocabulary.PASSES
    assert tuple(grid["head_dims"]["items"]["enum"]) == vocabulary.HEAD_DIMS
    config = with_change(lambda c: c["suites"]["smoke"]["grids"][0]["kernels"].append("flashy"))
    with pytest.raises(ConfigError, match=r"'flashy' is not allowed; allowed: naive, sdpa_math"):
        validate_config(config)


def test_a_malformed_or_missing_config_file_is_named_in_one_line(tmp_path):
    bad = tmp_path / "overlay.yaml"
    bad.write_text("suites:\n  mini:\n    measure: {warmup_ms: 5\n  other: [\n")
    with pytest.raises(ConfigError) as error:
        load_config(configfiles=["config/config.yaml", bad])
    message = str(error.value)
    assert message.startswith(f"config file {bad}, line 4, column 8: not valid YAML (expected ',' or '}}'")
    assert "\n" not in message
    listed = tmp_path / "list.yaml"
    listed.write_text("- suite: smoke\n")
    with pytest.raises(ConfigError, match=rf"config file {listed}: holds a list, not a mapping of config keys"):
        load_config(configfiles=[listed])
    with pytest.raises(ConfigError, match=rf"config file {tmp_path / 'nope.yaml'}: no such file"):
        load_config(configfiles=[tmp_path / "nope.yaml"])


def test_measure_set_on_the_command_line_wins_over_the_suites_own(tmp_path):
    from flashwatt.settings import measure_settings

    assert measure_settings(load_config(), "smoke")["min_repeats"] == 10  # the smoke suite's own
    given = load_config(overrides={"measure": {"min_repeats": 50, "energy_window_s": 5}})
    assert measure_settings(given, "smoke")["min_repeats"] == 50 and measure_settings(given, "seed")["min_repeats"] == 50
    assert measure_settings(given, "smoke")["warmup_ms"] == 20  # what the command line leaves alone stays the suite's
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("measure: {min_repeats: 40, min_time_ms: 7}\nsuites:\n  smoke:\n    measure: {min_time_ms: 9}\n")
    layered = load_config(configfiles=["config/config.yaml", overlay])  # config/config.yaml again: not a layer
    assert measure_settings(layered, "smoke")["min_repeats"] == 40
    assert measure_settings(layered, "smoke")["min_time_ms"] == 9  # the overlay's own suite setting is more specific
    assert measure_settings(layered, "seed")["min_time_ms"] == 7
    last = load_config(configfiles=[overlay], overrides={"measure": {"min_time_ms": 3}})
    assert measure_settings(last, "smoke")["min_time_ms"] == 3  # --config comes after the overlay


@pytest.mark.parametrize("overlay", sorted(p.name for p in __import__("pathlib").Path("config/overlays").glob("*.yaml")))
def test_every_overlay_validates_and_plans_its_suites(overlay):
    """Each overlay in config/overlays, read over config/config.yaml as its own comment says to
    run it, is a valid config whose suites it names all plan cells (a key the schema does not
    know, or a grid that plans nothing, fails here rather than on a GPU)."""
    from flashwatt.kinds import every_cell

    path = f"config/overlays/{overlay}"
    # (the files its comment's --configfile names, in order: an overlay may go over another)
    comment = " ".join(line.lstrip("#") for line in open(path) if line.startswith("#"))
    named_files = []
    for word in comment.split("--configfile", 1)[1].split() if "--configfile" in comment else []:
        word = word.strip("`.,;")
        if not (word.startswith("config/") and word.endswith(".yaml")):
            break
        named_files.append(word)
    layers = [f for f in named_files if f != "config/config.yaml"] or [path]
    assert path in layers, f"{path}: its comment's command does not read it"
    config = validate_config(load_config("config/config.yaml", configfiles=layers))
    named = yaml.safe_load(open(path)).get("suites", {})
    for suite in named:
        assert every_cell(config, suite), f"{path}: suite {suite} plans no cell"
