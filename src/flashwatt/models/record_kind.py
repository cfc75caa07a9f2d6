"""The kind a model cell's record carries (flashwatt.job_frame's envelope), the same on one
GPU (flashwatt.models.job) and on several (flashwatt.models.parallel_job)."""
from __future__ import annotations

KIND = "model"
