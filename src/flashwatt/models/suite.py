"""A suite's `models` section, expanded into model cells and the job spec of each.

    models:
      steps: {warmup_steps: 3, timed_steps: 10, attention_steps: 3}
      presets:                       # models of your own, beside flashwatt.models.presets
        my_llama: {path: /scratch/llama-3.2-1b}          # config.json (+ weights if present)
        wide_gpt2: {family: gpt2, n_embd: 1024, n_layer: 24, n_head: 16}
      grids:
        - models: [llama_3_2_1b, gpt2_124m]
          backends: [eager, sdpa_default, sdpa_cudnn, custom]
          precisions: [bf16]
          phases: [prefill, train]
          seq_lens: [1024, 4096]
          batches: [2]
          recompute: [false, true, 50]   # activation checkpointing (train cells only): none, every
                                         # decoder block, or a whole percent of them (50: every other)
          compiled: [false]          # torch.compile
          gpus: [1, 2, 4]            # world sizes (default [1])
          strategies: [fsdp, zigzag] # how several GPUs share a step (flashwatt.models.parallel)
          steps: {paired_rounds: 5}  # this grid's cells: any `steps` key, over the section's
        - models: [llama_3_2_1b]         # under the step-level controller (flashwatt.control.model_steps)
          backends: [sdpa_default]       # the backend the steps start with
          precisions: [bf16]
          phases: [train]
          seq_lens: [4096]
          batches: [2]
          governors:                     # one cell each (flashwatt.control.governor_setting)
            - {mode: front}              # the static front of (backend x pacing x micro-batch)
            - {mode: budget, budgets_w: [300, 450, 650]}
            - {mode: budget, schedule: [[0, 600], [20, 400]], temp_limit_c: 83}
            - {mode: energy}
          governor:                      # over the section's `governor` (defaults: step_defaults.GOVERNOR_DEFAULTS)
            seconds: 30                  # each governed run
            knobs: {micro_batches: [1, 2]}   # what the controller may turn (backends: the front's)
            pace_mix: {low: 0.3, period_s: 0.25}   # one GPU: time-share full duty with 0.3 (flashwatt.control.duty_mix)
            front: {backends: [sdpa_default, sdpa_cudnn, custom], micro_batches: [1, 2],
                    duties: [1.0, 0.8, 0.6, 0.45, 0.3], seconds: 3}

`recompute` takes true/false or a whole percent 0-100 of the decoder blocks, evenly
spread (flashwatt.models.recompute); true and 100 are one cell, as false and 0 are.
A prefill or decode with recompute is not a combination (checkpointing applies to
training) and is left out of the product, and so are a compiled cell on several GPUs
(torch.compile cells run on one), a decode compiled or on several GPUs (it runs on one,
uncompiled: a step over a KV cache of L tokens makes one token per sequence), a controller backend compiled or on several GPUs (it runs on one, uncompiled)
and hybrid below 4 GPUs (a ring of 2 across Ulysses groups of gpus/2). A
world size of 1 is the one-GPU cell (strategy none) whatever `strategies` lists; each
larger one takes every strategy listed. `steps.comm_steps` (profiled steps of the
communication split) goes to the multi-GPU cells' specs only, and `steps.control_settle_s`
(the controller's longest settling) to the controller cells' only (backend
`control_energy` or `control_<W>w`), so every other cell keeps the spec it always had;
`steps.paired_rounds` (0: none) goes to the one-GPU cells that time their backend beside
the SDPA default in alternating rounds (flashwatt.models.paired): neither the default's
own cells nor compiled or controller cells. A grid with `governors` makes governed cells
only (one per setting; name suffix `-gov-<setting>`), each with the merged `governor`
settings in its spec, and only they; a governor with a controller backend (control_*) is
refused.
An unknown model, or a context longer than a preset's positions, is refused with the grid's key before any job starts; a batch that does not
fit is a cell recorded `oom`, and a backend that cannot run the model one recorded
`skipped`, while the rest of the suite goes on.
"""
from __future__ import annotations

import itertools

from flashwatt.config_error import ConfigError
from flashwatt.models.cell import ModelCell
from flashwatt.models.job import DEFAULT_SETTLE_S, DEFAULT_STEPS
from flashwatt.models.step_defaults import GOVERNOR_DEFAULTS
from flashwatt.models.paired import why_unpaired
from flashwatt.models.parallel_job import PARALLEL_STEPS
from flashwatt.models.presets import model_spec
from flashwatt.models.recompute import recompute_percent

CONTROL_STEPS = {"control_settle_s": DEFAULT_SETTLE_S}
PAIRED_STEPS = ("paired_rounds",)
_POSITIONS = ("max_position_embeddings", "n_positions")


def grid_model_specs(grid: dict, user_presets: dict, key: str) -> dict[str, dict]:
    """The model spec of each model a grid names; an unknown one is a ConfigError naming
    `<key>.models[j]`."""
    specs = {}
    for j, name in enumerate(grid["models"]):
        try:
            specs[name] = model_spec(name, user_presets, f"{key}.models[{j}]")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return specs


def positions_of(spec: dict) -> int | None:
    settings = spec.get("settings", {})
    return next((int(settings[k]) for k in _POSITIONS if k in settings), None)


def cell_steps(steps: dict, cell: ModelCell) -> dict:
    """The steps a cell's job reads, and no others, so a setting for one kind of cell never
    makes the others' specs (and their records) stale: `comm_steps` for cells on several
    GPUs, `control_settle_s` for controller cells, `paired_rounds` (when above 0) for the
    cells that pair with the SDPA default (flashwatt.models.paired)."""
    drop = set(PAIRED_STEPS)
    if cell.gpus > 1:
        drop |= set(CONTROL_STEPS)
    else:
        drop |= set(PARALLEL_STEPS)
        if cell.control is None:
            drop |= set(CONTROL_STEPS)
            if steps.get("paired_rounds", 0) > 0 and why_unpaired(cell) is None:
                drop -= set(PAIRED_STEPS)
    return {k: v for k, v in steps.items() if k not in drop}


def governor_settings(section: dict, grid: dict) -> dict:
    """A grid's governor settings over the section's over the defaults (the front's and the
    knobs' entries merged key by key)."""
    out = {**GOVERNOR_DEFAULTS, "front": dict(GOVERNOR_DEFAULTS["front"])}
    for layer in (section.get("governor", {}), grid.get("governor", {})):
        for key, value in layer.items():
            out[key] = {**out[key], **value} if key in ("front", "knobs") else value
    return out


def grid_recompute(grid: dict, key: str) -> list[int]:
    """A grid's recompute settings as percents of the decoder blocks (default: none); a value
    that is not one is a ConfigError naming `<key>.recompute[j]`."""
    shares = []
    for j, value in enumerate(grid.get("recompute", [False])):
        try:
            shares.append(recompute_percent(value))
        except ValueError as err:
            raise ConfigError(f"config key {key}.recompute[{j}]: {err}") from None
    return list(dict.fromkeys(shares))


def grid_governors(grid: dict, key: str) -> list[str]:
    """The governor tokens of a grid (`governors`), or [""] for a grid without."""
    from flashwatt.control.governor_setting import settings_from_config

    if not grid.get("governors"):
        return [""]
    return [setting.token for setting in settings_from_config(grid["governors"], f"{key}.governors")]


def model_runs(config: dict, suite: str, measure: dict | None = None) -> dict[ModelCell, dict]:
    """Each model cell of the suite and its job spec (plain data), in a stable order; empty
    for a suite without a models section. `measure`: the suite's measure settings."""
    section = config["suites"][suite].get("models")
    if not section:
        return {}
    where = f"suites.{suite}.models"
    steps = {**DEFAULT_STEPS, **PARALLEL_STEPS, **CONTROL_STEPS, **section.get("steps", {})}
    seed = int((measure or {}).get("seed", 0))
    user = section.get("presets", {})
    cells: dict[ModelCell, dict] = {}
    for i, grid in enumerate(section["grids"]):
        key = f"{where}.grids[{i}]"
        specs = grid_model_specs(grid, user, key)
        grid_steps = {**steps, **grid.get("steps", {})}
        strategies = grid.get("strategies", ["none"])
        for gpus in grid.get("gpus", [1]):
            if gpus > 1 and not [s for s in strategies if s != "none"]:
                raise ConfigError(f"config key {key}.strategies: gpus {gpus} needs a strategy for several GPUs "
                                  f"(fsdp, ring, zigzag, ulysses, hybrid)")
        placements = [(1, "none")] if 1 in grid.get("gpus", [1]) else []
        placements += [(g, s) for g in grid.get("gpus", [1]) if g > 1 for s in strategies
                       if s != "none" and not (s == "hybrid" and (g < 4 or g % 2))]
        governors = grid_governors(grid, key)
        governed = governor_settings(section, grid)
        if governed.get("pace_mix") and governors != [""] and any(g > 1 for g in grid.get("gpus", [1])):
            # (each rank would read the mix's periods from its own clock)
            raise ConfigError(f"config key {key}.governor.pace_mix: runs on one GPU; this grid's gpus "
                              f"{grid.get('gpus')} take several")
        for name, backend, precision, phase, seq_len, batch, recompute, compiled, (gpus, strategy), governor in \
                itertools.product(grid["models"], grid["backends"], grid["precisions"], grid["phases"], grid["seq_lens"],
                                  grid["batches"], grid_recompute(grid, key), grid.get("compiled", [False]),
                                  placements, governors):
            controlled = backend.startswith("control_")
            if ((recompute and phase != "train") or (compiled and gpus > 1) or (controlled and (compiled or gpus > 1))
                    or (phase == "decode" and (compiled or gpus > 1))):
                continue
            positions = positions_of(specs[name])
            if positions is not None and seq_len > positions:
                raise ConfigError(f"config key {key}.seq_lens: {seq_len} is longer than model {name}'s "
                                  f"{positions} positions")
            try:
                cell = ModelCell(suite, name, backend, precision, phase, seq_len, batch, recompute, compiled, gpus,
                                 strategy, governor)
            except ValueError as err:
                raise ConfigError(f"config key {key}: {err}") from None
            cells[cell] = {"model": specs[name], "steps": cell_steps(grid_steps, cell), "seed": seed,
                           "measure": dict(measure or {})}
            if governor:
                cells[cell]["governor"] = governed
    return {cell: cells[cell] for cell in sorted(cells)}
