"""flashwatt: how fast and how energy-hungry attention is on your GPUs, measured honestly."""

__version__ = "0.1.0"
