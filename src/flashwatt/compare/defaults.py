"""The comparison's defaults, where the command line (which imports no SciPy to parse its
options) and the intervals both read them."""

CONFIDENCE = 0.95  # the intervals' level
RESAMPLES = 2000   # bootstrap resamples per interval
SEED = 0           # the resamples' seed: the same files give the same intervals
DEFAULT_OUT = "results/compare"
