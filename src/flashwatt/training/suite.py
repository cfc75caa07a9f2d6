"""A suite's `training` section, expanded into training cells and the job spec of each.

    training:
      data:
        corpus: /usr/share/doc/python3.11/html/_sources   # plain text (file or folder), or wikitext103
        validation_fraction: 0.05                         # of the documents (a local corpus only)
        seed: 0                                           # the train/validation split
        tokenizer: {vocab_size: 8192}                     # or {gpt2_dir: folder with GPT-2's files}
      cache: results/training-cache     # tokenizer, token shards, checkpoints
      evaluation: {evals: 16, validation_windows: 32}
      target_loss: 4.5                  # validation loss the time/energy-to-target is taken at
      warmup_fraction: 0.05             # of the steps, linear
      schedule: {floor: 0.1, decay_fraction: 0.2}
      betas: {adamw: [0.9, 0.95], lion: [0.9, 0.99]}
      grad_clip: 1.0                    # global gradient norm (0: off)
      checkpoint_every_s: 60            # wall seconds between checkpoints (0: every evaluation)
      presets: {...}                    # models of your own, as in the models section
      grids:
        - models: [llama_20m]
          backends: [sdpa_default]
          precisions: [bf16]
          optimizers: [adamw, lion]
          schedules: [cosine, wsd]
          lrs: {adamw: [0.002], lion: [0.0003]}   # or one list for every optimizer
          dropouts: [0.0]                         # residual and embedding (gpt2 family)
          weight_decays: {adamw: [0.1], lion: [0.3]}  # likewise
          batches: [32]
          contexts: [256]
          token_budgets: [4000000]
          seeds: [0, 1, 2]
          governors:                              # runs under the step-level controller, one cell each
            - {mode: budget, budgets_w: [300, 450, 650]}   # (flashwatt.control.governor_setting)
      governor: {knobs: {micro_batches: [1, 2]}, on_peer_loss: end}   # what the controller may turn

Bad values are refused with their key before any job starts: an unknown model, optimizer
or schedule, a learning rate list missing for an optimizer of the grid, a context longer
than the model's positions, a budget smaller than one batch, dropout on a model that has
no residual dropout, a schedule whose warm-up and decay overlap. A grid with `governors`
makes one run per setting and everything else of the grid, under the step-level
controller (`-gov-<setting>` in the name): its losses against tokens, seconds and joules
as any run's, its 1 s windows judged against the budget. The controller may turn the
knobs of the section's `governor.knobs` (default: the run's own backend, pacing only). The corpus itself is
read by the suite's data rule (flashwatt.training.data), which names the same key when
the path does not exist or holds no text.
"""
from __future__ import annotations

import itertools

from flashwatt.config_error import ConfigError
from flashwatt.models.presets import has_residual_dropout
from flashwatt.models.suite import grid_governors, grid_model_specs, positions_of
from flashwatt.training.cell import TrainCell

DATA_MANIFEST = "results/{suite}/training-data.json"
DEFAULTS = {"cache": "results/training-cache", "evaluation": {"evals": 16, "validation_windows": 32},
            "target_loss": None, "warmup_fraction": 0.05, "schedule": {}, "betas": {}, "grad_clip": 1.0,
            "checkpoint_every_s": 60.0, "governor": {"knobs": {}, "on_peer_loss": "end"}}


def _per_optimizer(grid: dict, name: str, optimizer: str, key: str, default: list | None = None) -> list[float]:
    """A grid list that may be given per optimizer (lrs, weight_decays): Lion wants a
    learning rate 3-10x smaller and a weight decay as many times larger than AdamW."""
    values = grid.get(name, default)
    if isinstance(values, dict):
        if optimizer not in values:
            raise ConfigError(f"config key {key}.{name}: nothing for optimizer {optimizer!r} "
                              f"(give {name}.{optimizer}, or one list for every optimizer)")
        return list(values[optimizer])
    return list(values)


def training_section(config: dict, suite: str) -> dict | None:
    section = config["suites"][suite].get("training")
    if not section:
        return None
    return {**DEFAULTS, **section, "evaluation": {**DEFAULTS["evaluation"], **section.get("evaluation", {})},
            "governor": {**DEFAULTS["governor"], **section.get("governor", {})}}


def training_runs(config: dict, suite: str, measure: dict | None = None) -> dict[TrainCell, dict]:
    """Each training cell of the suite and its job spec (plain data), in a stable order;
    empty for a suite without a training section."""
    from flashwatt.training.schedules import DEFAULT_DECAY_FRACTION, DEFAULT_FLOOR, check_schedule, warmup_steps

    section = training_section(config, suite)
    if section is None:
        return {}
    where = f"suites.{suite}.training"
    user = section.get("presets", {})
    shared = {key: section[key] for key in ("cache", "evaluation", "target_loss", "warmup_fraction", "schedule",
                                            "betas", "grad_clip", "checkpoint_every_s")}
    shared["data"] = DATA_MANIFEST.format(suite=suite)
    shared["measure"] = dict(measure or {})
    cells: dict[TrainCell, dict] = {}
    for i, grid in enumerate(section["grids"]):
        key = f"{where}.grids[{i}]"
        specs = grid_model_specs(grid, user, key)
        governors = grid_governors(grid, key)
        for optimizer in grid["optimizers"]:
            lrs = _per_optimizer(grid, "lrs", optimizer, key)
            decays = _per_optimizer(grid, "weight_decays", optimizer, key, [0.1])
            for (name, backend, precision, schedule, lr, dropout, wd, batch, context, budget, seed,
                 governor) in itertools.product(grid["models"], grid["backends"], grid["precisions"],
                                                grid["schedules"], lrs, grid.get("dropouts", [0.0]), decays,
                                                grid["batches"], grid["contexts"], grid["token_budgets"],
                                                grid["seeds"], governors):
                spec = specs[name]
                positions = positions_of(spec)
                if positions is not None and context > positions:
                    raise ConfigError(f"config key {key}.contexts: {context} is longer than model {name}'s "
                                      f"{positions} positions")
                if dropout > 0 and "family" in spec and not has_residual_dropout(spec["family"]):
                    raise ConfigError(f"config key {key}.dropouts: {dropout:g} for model {name}, a {spec['family']} "
                                      f"model without residual dropout (attention dropout is never used: the "
                                      f"kernels do not take it); use a gpt2-family model or dropout 0")
                try:
                    cell = TrainCell(suite, name, backend, precision, optimizer, schedule, lr, dropout, wd,
                                     batch, context, budget, seed, governor)
                except ValueError as err:
                    raise ConfigError(f"config key {key}: {err}") from None
                warmup = warmup_steps(cell.steps, section["warmup_fraction"])
                try:
                    check_schedule(schedule, cell.steps, warmup, **{"floor": DEFAULT_FLOOR,
                                                                   "decay_fraction": DEFAULT_DECAY_FRACTION,
                                                                   **section["schedule"]})
                except ValueError as err:
                    raise ConfigError(f"config key {key}: {cell.name}: {err}") from None
                cells[cell] = {"model": spec, **shared}
                if governor:
                    cells[cell]["governor"] = section["governor"]
    return {cell: cells[cell] for cell in sorted(cells)}
