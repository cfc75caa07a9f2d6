"""Model-level cells: a whole model's step (Llama and GPT-2 shapes from transformers, random
weights) with each attention backend, on one GPU or several, its time split, attention
share, MFU, memory and energy per token.

Modules: presets (the shapes), attention (a backend as a transformers attention function
and its mask function), attention_timer (the attention share), check (the model against
a float32/float64 reference), flops (MFU), step (building and timing a step), cell,
suite, job, summary, figures. Several GPUs: parallel (a model prepared for a strategy,
its batch layout and loss), fsdp (FSDP2 sharding), cp_attention (context-parallel
attention through flashwatt.distributed), parallel_step, parallel_check (against one
process), comm_timeline (communication, exposed and hidden), parallel_job. The workflow
imports cell and suite while it plans, where torch is not needed.
"""
