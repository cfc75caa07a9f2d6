"""The one error a bad configuration raises, worded for the person who wrote the config:
it names the key (as a path such as `suites.seed.grids[0].kernels[2]`) and what is
allowed there. Every planner raises it, so it sits below them all."""


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""
