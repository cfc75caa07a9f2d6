"""The attention cell: one attention call measured for speed, correctness and energy
(`cell`), its job (`job`), the suite's summary table (`summary`) and its figures (`figures`)."""
