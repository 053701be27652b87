"""Llama (`LlamaForCausalLM`): RMSNorm pre-LN, SwiGLU, RoPE, grouped-query attention.

Llama 3.x checkpoints stretch RoPE's frequencies for their long context
(`rope_type='llama3'`); `linear` scaling is read too (`ModelConfig.rope_scaling`).

Hugging Face's RoPE rotates the pairs (x[i], x[i + H/2]) ("rotate half"), as ours does,
so q and k projections are copied without permuting columns. SwiGLU: our wi_0 is
`gate_proj`, wi_1 `up_proj`, wo `down_proj`.

Two variants share the tensor layout: Mistral (`MistralForCausalLM`) adds a sliding
window on every layer (HF: key s visible from query t when t - s < window, ours:
`ModelConfig.sliding_window`, the same rule), and Qwen2 (`Qwen2ForCausalLM`) has biases on
q/k/v only (`ModelConfig.qkv_bias=True`, `use_bias=False`) and a window on every layer or
none (per-layer windows, `max_window_layers` inside the stack, are refused).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  attention,
  linear,
  norm,
  require,
  same,
  unsupported,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
PREFIX = "model."


# Hugging Face's `rope_type` -> ours, and its parameters -> our fields (Llama 3.1+: llama3).
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}
ROPE_FIELDS = {
  "factor": "rope_scaling_factor",
  "low_freq_factor": "rope_low_freq_factor",
  "high_freq_factor": "rope_high_freq_factor",
  "original_max_position_embeddings": "rope_original_max_len",
}
LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
ROPE_USED = {
  "none": (),
  "linear": ("factor",),
  "llama3": LLAMA3,
  "yarn": ("factor", "original_max_position_embeddings"),
}
# yarn's optional parameters (HF's defaults when absent) -> our fields
YARN_OPTIONAL = {
  "beta_fast": ("rope_beta_fast", 32.0),
  "beta_slow": ("rope_beta_slow", 1.0),
  "truncate": ("rope_truncate", True),
  "attention_factor": ("rope_attention_factor", None),
}


def rope_fields(hf: Mapping[str, Any], a: str, partial: bool = False) -> dict[str, Any]:
  """Our RoPE fields from `rope_parameters` (transformers 5) or `rope_theta` +
  `rope_scaling` (4.x). `partial`: the family rotates part of each head
  (`partial_rotary_factor`, GPT-NeoX's `rotary_pct`); elsewhere a factor other than 1 is
  refused."""
  rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ROPE_TYPES:
    unsupported(a, "rope_type", rope_type, tuple(ROPE_TYPES))
  scaling = ROPE_TYPES[rope_type]
  theta = rope.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10_000.0)))
  fields = {"rope_theta": float(theta), "rope_scaling": scaling}
  for key in ROPE_USED[scaling]:
    if key not in rope:
      raise ValueError(f"{a}: rope_type={rope_type!r} needs rope_parameters[{key!r}]")
    fields[ROPE_FIELDS[key]] = rope[key]
  if scaling == "yarn":
    fields |= _yarn_fields(rope)
  fraction = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  fraction = hf.get("rotary_pct", 1.0) if fraction is None else fraction
  if fraction != 1.0 and not partial:
    unsupported(a, "partial_rotary_factor", fraction, (1.0,))
  return fields | {"rope_fraction": float(fraction)}


def _yarn_fields(rope: Mapping[str, Any]) -> dict[str, Any]:
  fields = {ours: rope.get(key) or default for key, (ours, default) in YARN_OPTIONAL.items()}
  fields["rope_truncate"] = rope.get("truncate", True)
  mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
  if fields["rope_attention_factor"] is None and mscale and mscale_all_dim:  # DeepSeek's form
    factor = rope["factor"]

    def get(m: float) -> float:
      return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    fields["rope_attention_factor"] = float(get(mscale) / get(mscale_all_dim))
  return fields


def rope_to_hf(c: ModelConfig) -> dict[str, Any]:
  """`rope_parameters` for our RoPE fields."""
  rope_type = next(k for k, v in ROPE_TYPES.items() if v == c.rope_scaling)
  out = {"rope_type": rope_type, "rope_theta": c.rope_theta}
  if c.rope_fraction != 1.0:
    out["partial_rotary_factor"] = c.rope_fraction
  if c.rope_scaling == "yarn":
    out |= {key: getattr(c, ours) for key, (ours, _) in YARN_OPTIONAL.items()}
  return out | {key: getattr(c, ROPE_FIELDS[key]) for key in ROPE_USED[c.rope_scaling]}


def config_from_hf(hf: Mapping[str, Any], a: str = ARCHITECTURE) -> dict[str, Any]:
  bias = (hf.get("attention_bias", False), hf.get("mlp_bias", False))
  if bias[0] != bias[1]:  # one ModelConfig.use_bias covers attention and feed-forward
    unsupported(a, "(attention_bias, mlp_bias)", bias, ((False, False), (True, True)))
  return common(hf, a, bool(bias[0]))


SWIGLU = {"silu": "swiglu"}  # Hugging Face `hidden_act` of the gate -> our gated activation


def common(
  hf: Mapping[str, Any],
  a: str,
  bias: bool,
  activations: Mapping[str, str] = SWIGLU,
  partial_rope: bool = False,
) -> dict[str, Any]:
  """The fields every Llama-family config shares; `bias` = biases on every projection,
  `activations` the `hidden_act` values the family may have -> our activation,
  `partial_rope` whether it may rotate part of each head (`rope_fields`)."""
  act = activations[require(hf, a, "hidden_act", tuple(activations))]
  d, n = hf["hidden_size"], hf["num_attention_heads"]
  k = hf.get("num_key_value_heads") or n
  head_dim = hf.get("head_dim") or d // n
  return {
    **PLAIN,  # first: the fields below may set some of them
    "family": "decoder",
    "vocab_size": hf["vocab_size"],
    "d_model": d,
    "num_heads": n,
    "num_layers": hf["num_hidden_layers"],
    "d_ff": hf["intermediate_size"],
    "max_len": hf["max_position_embeddings"],
    "position": "rope",
    **rope_fields(hf, a, partial_rope),
    "norm": "rmsnorm",
    "norm_position": "pre",
    "norm_eps": hf.get("rms_norm_eps", 1e-6),
    "activation": act,
    "use_bias": bias,
    "tie_embeddings": hf.get("tie_word_embeddings", False),
    "type_vocab_size": 0,
    "dropout_rate": 0.0,
    "attention_dropout_rate": hf.get("attention_dropout", 0.0),
    "num_kv_heads": None if k == n else k,
    "attention_head_dim": None if head_dim * n == d else head_dim,
  }


def mistral_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  return {**common(hf, MISTRAL, False), "sliding_window": hf.get("sliding_window")}


def qwen_window(hf: Mapping[str, Any], a: str) -> int | None:
  """ModelConfig.sliding_window of a Qwen config (`use_sliding_window`, `layer_types`)."""
  window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
  layers = hf["num_hidden_layers"]
  kinds = hf.get("layer_types") or ["full_attention"] * layers
  if window is None:  # HF ignores layer_types without a window: every layer is full
    kinds = ["full_attention"] * layers
  if len(set(kinds)) > 1:
    unsupported(
      a,
      "layer_types",
      "a mix of sliding_attention and full_attention",
      ("every layer full_attention", "every layer sliding_attention"),
    )
  return window if kinds[0] == "sliding_attention" else None


def qwen2_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = {**common(hf, QWEN2, False), "qkv_bias": True}
  return fields | {"sliding_window": qwen_window(hf, QWEN2)}


def mistral_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = {**config_to_hf(c), "model_type": "mistral", "sliding_window": c.sliding_window}
  for key in ("attention_bias", "mlp_bias"):
    del out[key]
  return out


def qwen_window_to_hf(c: ModelConfig) -> dict[str, Any]:
  """The window fields of a Qwen config.json for ModelConfig.sliding_window."""
  window = c.sliding_window is not None
  return {
    "use_sliding_window": window,
    "sliding_window": c.sliding_window,
    "max_window_layers": 0 if window else c.num_layers,
    "layer_types": ["sliding_attention" if window else "full_attention"] * c.num_layers,
  }


def qwen2_to_hf(c: ModelConfig) -> dict[str, Any]:
  return mistral_to_hf(c) | {"model_type": "qwen2"} | qwen_window_to_hf(c)


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "llama",
    "vocab_size": c.vocab_size,
    "hidden_size": c.d_model,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.kv_heads,
    "head_dim": c.head_dim,
    "num_hidden_layers": c.num_layers,
    "intermediate_size": c.d_ff,
    "max_position_embeddings": c.max_len,
    "rope_parameters": rope_to_hf(c),
    "rms_norm_eps": c.norm_eps,
    "hidden_act": "silu",
    "attention_bias": c.use_bias,
    "mlp_bias": c.use_bias,
    "tie_word_embeddings": c.tie_embeddings,
    "attention_dropout": c.attention_dropout_rate,
  }


def decoder_rules(c: ModelConfig, feed_forward, projections=None, norm_names=None) -> list[Rule]:
  """The tensors of a Llama-shaped decoder. `feed_forward(c, ours_layer, hf_layer, i)` gives
  layer i's feed-forward rules (dense SwiGLU, or a mixture of experts);
  `projections(c, ours_attention, hf_attention)` the attention projections' (default:
  separate q/k/v/o_proj); `norm_names` a layer's (our norm, Hugging Face's) pairs (default:
  `_norm_names`)."""
  projections = projections or _projections
  norm_names = norm_names or _norm_names(c)
  norm_bias = c.norm == "layernorm" and c.norm_bias  # LayerNorm (StarCoder 2) or RMSNorm
  out = [same("token_embed/embedding", f"{PREFIX}embed_tokens.weight")]
  for i in range(c.num_layers):
    ours, hf = f"decoder/layer_{i}", f"{PREFIX}layers.{i}"
    out += projections(c, f"{ours}/self_attention", f"{hf}.self_attn")
    if c.qk_norm:  # Qwen3: one RMSNorm scale [H] for the query heads, one for the key heads
      out += norm(f"{ours}/self_attention/query_norm", f"{hf}.self_attn.q_norm", bias=False)
      out += norm(f"{ours}/self_attention/key_norm", f"{hf}.self_attn.k_norm", bias=False)
    for our_norm, hf_norm in norm_names:
      out += norm(f"{ours}/{our_norm}", f"{hf}.{hf_norm}", bias=norm_bias)
    out += feed_forward(c, ours, hf, i)
  out += norm("decoder/final_norm", f"{PREFIX}norm", bias=norm_bias)
  if not c.tie_embeddings:
    out += linear("lm_head", "lm_head", bias=False)
  return out


def _norm_names(c: ModelConfig) -> tuple[tuple[str, str], ...]:
  """(our norm, Hugging Face's) of a layer: pre-LN, sandwich (Gemma 2 / 3: a norm before
  and after each sublayer), or sublayer-post (OLMo 2: a norm after each sublayer)."""
  if c.norm_position == "sublayer_post":
    return (
      ("self_attention_norm", "post_attention_layernorm"),
      ("ffn_norm", "post_feedforward_layernorm"),
    )
  if c.norm_position == "sandwich":
    return (
      ("self_attention_norm", "input_layernorm"),
      ("self_attention_norm_post", "post_attention_layernorm"),
      ("ffn_norm", "pre_feedforward_layernorm"),
      ("ffn_norm_post", "post_feedforward_layernorm"),
    )
  return (("self_attention_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"))


def _projections(c: ModelConfig, ours: str, hf: str) -> list[Rule]:
  names = tuple(f"{hf}.{x}_proj" for x in "qkvo")
  n, k, h = c.num_heads, c.kv_heads, c.head_dim
  return attention(ours, names, n, h, k, qkv_bias=c.qkv_biases, out_bias=c.use_bias)


def swiglu(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  """A dense SwiGLU feed-forward: wi_0 = gate_proj, wi_1 = up_proj, wo = down_proj."""
  out = linear(f"{ours}/ffn/wi_0", f"{hf}.mlp.gate_proj", c.use_bias)
  out += linear(f"{ours}/ffn/wi_1", f"{hf}.mlp.up_proj", c.use_bias)
  return out + linear(f"{ours}/ffn/wo", f"{hf}.mlp.down_proj", c.use_bias)


def rules(c: ModelConfig) -> list[Rule]:
  return decoder_rules(c, swiglu)


CONVERTERS = {
  ARCHITECTURE: Converter(ARCHITECTURE, "llama", config_from_hf, config_to_hf, rules, PREFIX),
  MISTRAL: Converter(MISTRAL, "mistral", mistral_from_hf, mistral_to_hf, rules, PREFIX),
  QWEN2: Converter(QWEN2, "qwen2", qwen2_from_hf, qwen2_to_hf, rules, PREFIX),
}
