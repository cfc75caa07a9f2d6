"""The model shapes flashwatt measures, as `transformers` configs with random weights.

Each preset is the published config's shape (hidden size, layers, heads, K/V heads, FFN,
vocabulary, positions, tied embeddings, RoPE), so a random-weight model has exactly the
published parameter count (tests/test_models.py checks every one against the model
card) and runs the same matmuls and attention as the real one. No download, no token.

A suite may add its own models under `models.presets`, each either
    {path: /local/folder}            a folder with config.json (real weights loaded when present)
    {family: llama, hidden_size: ..} a shape given in the config
"""
from __future__ import annotations

from dataclasses import dataclass, field

# family -> the transformers config class (by name: planning the DAG imports no transformers)
FAMILIES = {"llama": "LlamaConfig", "gpt2": "GPT2Config"}

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


@dataclass(frozen=True)
class Preset:
    family: str
    settings: dict = field(default_factory=dict)
    published_parameters: int | None = None  # the model card's count, checked by the tests


PRESETS: dict[str, Preset] = {
    # meta-llama/Llama-3.2-1B config.json
    "llama_3_2_1b": Preset("llama", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE,
        bos_token_id=128000, eos_token_id=128001), 1_235_814_400),
    # meta-llama/Llama-3.2-3B config.json
    "llama_3_2_3b": Preset("llama", dict(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE,
        bos_token_id=128000, eos_token_id=128001), 3_212_749_824),
    # meta-llama/Llama-2-7b-hf config.json
    "llama_2_7b": Preset("llama", dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=1, eos_token_id=2), 6_738_415_616),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama_3_8b": Preset("llama", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=128000, eos_token_id=128001), 8_030_261_248),
    # openai-community/gpt2 config.json (124M)
    "gpt2_124m": Preset("gpt2", dict(
        n_embd=768, n_layer=12, n_head=12, n_inner=None, vocab_size=50257, n_positions=1024,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        bos_token_id=50256, eos_token_id=50256), 124_439_808),
    # The training study's small Llama (12.6M parameters with an 8192-id vocabulary; the
    # study sets the vocabulary to its tokenizer's): 6 blocks of width 384, grouped-query
    # attention with 6 heads and 2 K/V heads of dim 64.
    "llama_small": Preset("llama", dict(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
        num_key_value_heads=2, head_dim=64, vocab_size=8192, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Small shapes of each family (head dim 64, which every backend runs): the CPU tests.
    "llama_tiny": Preset("llama", dict(
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gpt2_tiny": Preset("gpt2", dict(
        n_embd=256, n_layer=2, n_head=4, vocab_size=512, n_positions=2048, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0)),
}


def model_spec(name: str, user_presets: dict | None = None, where: str = "model") -> dict:
    """What a job needs to build the model `name`: {"family", "settings"} or {"path"}.
    Plain data, so it travels in a job spec; `where` names the config key in errors."""
    user_presets = user_presets or {}
    if name in user_presets:
        entry = dict(user_presets[name])
        if "path" in entry:
            return {"name": name, "path": str(entry["path"])}
        family = entry.pop("family", None)
        if family not in FAMILIES:
            raise ValueError(f"config key {where}: model {name!r} needs `path` or `family` ({', '.join(FAMILIES)})")
        return {"name": name, "family": family, "settings": entry}
    if name not in PRESETS:
        raise ValueError(f"config key {where}: unknown model {name!r}; presets: {', '.join(PRESETS)}"
                         + (f"; this suite adds: {', '.join(user_presets)}" if user_presets else ""))
    preset = PRESETS[name]
    return {"name": name, "family": preset.family, "settings": dict(preset.settings)}


# The dropouts of each family's config. The published GPT-2 config trains with 0.1, but
# kernels have no attention dropout, and a benchmark step is measured without it (as
# pretraining runs mostly are); the training study sets the residual and embedding
# dropout per cell and never drops attention probabilities, so that every backend
# computes the same function. Llama has attention dropout only.
ATTENTION_DROPOUT_KEYS = {"llama": ("attention_dropout",), "gpt2": ("attn_pdrop",)}
RESIDUAL_DROPOUT_KEYS = {"llama": (), "gpt2": ("resid_pdrop", "embd_pdrop")}


def has_residual_dropout(family: str) -> bool:
    return bool(RESIDUAL_DROPOUT_KEYS.get(family))


def build_config(spec: dict, dropout: float = 0.0, attention_dropout: float = 0.0, **overrides):
    """The transformers config of a model spec (model_spec's output): residual and
    embedding dropout `dropout`, attention dropout `attention_dropout`, and any other
    config key set by `overrides` (the training study's vocabulary size)."""
    import transformers

    if "path" in spec:
        from pathlib import Path

        path = Path(spec["path"])
        if not (path / "config.json").is_file():
            raise ValueError(f"model {spec['name']!r}: {path} has no config.json")
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    else:
        config = getattr(transformers, FAMILIES[spec["family"]])(**spec["settings"])
    for key in ATTENTION_DROPOUT_KEYS.get(config.model_type, ()):
        setattr(config, key, attention_dropout)
    for key in RESIDUAL_DROPOUT_KEYS.get(config.model_type, ()):
        setattr(config, key, dropout)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@dataclass(frozen=True)
class Shape:
    """The numbers the FLOP count and the cell checks need, read from a config."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    tied: bool


def shape_of(config) -> Shape:
    if config.model_type == "gpt2":
        return Shape(config.n_layer, config.n_embd, config.n_head, config.n_head, config.n_embd // config.n_head,
                     config.vocab_size, config.n_positions, bool(config.tie_word_embeddings))
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Shape(config.num_hidden_layers, config.hidden_size, heads, config.num_key_value_heads or heads, head_dim,
                 config.vocab_size, config.max_position_embeddings, bool(config.tie_word_embeddings))
