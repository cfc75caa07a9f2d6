"""Model-level cells: a whole model's step (Llama and GPT-2 shapes from transformers, random
weights) with each attention backend, its time split, attention share, MFU, memory and
energy per token.

Modules: presets (the shapes), attention (a backend as a transformers attention function
and its mask function), attention_timer (the attention share), check (the model against
a float32/float64 reference), flops (MFU), step (building and timing a step), cell,
suite, job, summary, figures, parallel (FSDP2 and context parallelism). The workflow
imports cell and suite while it plans, where torch is not needed.
"""
