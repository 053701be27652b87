"""Gemma (`GemmaForCausalLM`, Gemma 1): the Llama tensor layout with three differences.

- Every RMSNorm multiplies by (1 + weight), the weight starting at 0
  (`ModelConfig.norm_scale_plus_one`; the checkpoint's weight is our scale as it is).
- Token embeddings are multiplied by sqrt(D) (`scale_embeddings`), in the compute dtype as
  Hugging Face does (its bf16 models round sqrt(D) to bf16 first; so does ours).
- The feed-forward is GeGLU with tanh GELU (`geglu_tanh`). Hugging Face reads the legacy
  `hidden_act='gelu'` of the original Gemma configs as the tanh form, and so do we.

Heads are usually wider than D / N (`head_dim` 256: `attention_head_dim`) and the output
is tied to the embeddings.

Gemma 2 (`Gemma2ForCausalLM`) adds:
- a norm before and after each sublayer (`norm_position='sandwich'`: `input_layernorm` /
  `post_attention_layernorm` around attention, `pre_feedforward_layernorm` /
  `post_feedforward_layernorm` around the feed-forward);
- local (`sliding_window`) and global layers alternating, `layer_types` ->
  `local_global_pattern` ('LG'; the shortest period of the list);
- scores soft-capped (`attn_logit_softcapping` -> `attention_softcap`), and so are the
  final logits (`final_logit_softcapping` -> `logits_softcap`);
- scores scaled by `query_pre_attn_scalar`**-0.5 (`attention_scale`; None when that is
  H**-0.5).

Gemma 3 text (`Gemma3ForCausalLM`, the 1B checkpoints; the larger ones are multimodal and
refused by architecture) is Gemma 2 with QK-norm (its scales also applied as 1 + w), five
local layers per global one ('LLLLLG'), usually no soft caps, and two RoPEs: the global
layers' base and scaling (`rope_parameters['full_attention']`), and the local layers'
unscaled base (`rope_parameters['sliding_attention']` -> `rope_local_theta`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, layer_pattern, layer_types, require, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "GemmaForCausalLM"
GELU_TANH = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu": "geglu_tanh"}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "attention_bias", (False,))
  require(hf, a, "use_bidirectional_attention", (None, False))
  fields = llama.common(hf, a, False, GELU_TANH)
  fields |= {"norm_scale_plus_one": True, "scale_embeddings": True}
  return fields | {"tie_embeddings": hf.get("tie_word_embeddings", True)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"}
  del out["mlp_bias"]
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "gemma", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}


GEMMA2 = "Gemma2ForCausalLM"
GEMMA3 = "Gemma3ForCausalLM"


def _pattern(hf: Mapping[str, Any], a: str, default_period: int) -> str:
  """`local_global_pattern` of `layer_types` (transformers 5), else of the 4.x rule: layer
  i is global when (i + 1) % period == 0 (Gemma 2: 2; Gemma 3: `sliding_window_pattern`)."""
  layers = hf["num_hidden_layers"]
  types = hf.get("layer_types")
  if types is None:
    period = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", default_period))
    return "L" * (period - 1) + "G"
  return layer_pattern(a, types, layers)


def _softcaps(hf: Mapping[str, Any]) -> dict[str, Any]:
  return {
    "attention_softcap": hf.get("attn_logit_softcapping"),
    "logits_softcap": hf.get("final_logit_softcapping"),
  }


def _sandwich(hf: Mapping[str, Any], a: str, period: int) -> dict[str, Any]:
  """The fields Gemma 2 and 3 share: Gemma 1's, sandwich norms, local and global layers,
  scores scaled by query_pre_attn_scalar**-0.5."""
  require(hf, a, "attention_bias", (False,))
  require(hf, a, "use_bidirectional_attention", (None, False))
  hf = {**hf, "hidden_act": hf.get("hidden_activation", hf.get("hidden_act"))}
  fields = llama.common(hf, a, False, GELU_TANH)
  fields |= {"norm_scale_plus_one": True, "scale_embeddings": True, "norm_position": "sandwich"}
  fields |= {"tie_embeddings": hf.get("tie_word_embeddings", True)}
  fields |= {
    "sliding_window": hf["sliding_window"],
    "local_global_pattern": _pattern(hf, a, period),
  }
  scale = float(hf.get("query_pre_attn_scalar", 256)) ** -0.5
  head_dim = fields["attention_head_dim"] or fields["d_model"] // fields["num_heads"]
  return fields | {"attention_scale": None if scale == head_dim**-0.5 else scale}


def _sandwich_to_hf(c: ModelConfig, model_type: str) -> dict[str, Any]:
  out = config_to_hf(c) | {"model_type": model_type, "hidden_activation": "gelu_pytorch_tanh"}
  del out["hidden_act"]
  scalar = (c.attention_scale or c.head_dim**-0.5) ** -2  # 144.00000000000003 -> 144
  out["query_pre_attn_scalar"] = (
    round(scalar) if abs(scalar - round(scalar)) < 1e-9 * scalar else scalar
  )
  out |= {"sliding_window": c.sliding_window, "layer_types": layer_types(c)}
  return out | {
    "attn_logit_softcapping": c.attention_softcap,
    "final_logit_softcapping": c.logits_softcap,
  }


def gemma2_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  return _sandwich(hf, GEMMA2, 2) | _softcaps(hf)


def gemma2_to_hf(c: ModelConfig) -> dict[str, Any]:
  return _sandwich_to_hf(c, "gemma2")


def gemma3_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Gemma 3 text: as Gemma 2 with QK-norm, usually no soft caps, and two RoPEs: the
  global layers' (its base and scaling) and the local layers' (`rope_local_theta`)."""
  a = GEMMA3
  rope = hf.get("rope_parameters") or {}
  if "full_attention" in rope:  # transformers 5: one set of RoPE parameters per layer kind
    local = rope.get("sliding_attention", {})
    hf = {**hf, "rope_parameters": rope["full_attention"]}
  else:  # 4.x: rope_theta + rope_scaling for the global layers, rope_local_base_freq
    local = {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
  if local.get("rope_type", "default") != "default":
    unsupported(a, "the local layers' rope_type", local["rope_type"], ("default",))
  fields = _sandwich(hf, a, 6) | _softcaps(hf) | {"qk_norm": True}
  return fields | {"rope_local_theta": float(local.get("rope_theta", 10_000.0))}


def gemma3_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = _sandwich_to_hf(c, "gemma3_text")
  local = {"rope_type": "default", "rope_theta": c.rope_local_theta}
  out["rope_parameters"] = {"full_attention": out["rope_parameters"], "sliding_attention": local}
  return out


CONVERTERS |= {
  GEMMA2: Converter(GEMMA2, "gemma2", gemma2_from_hf, gemma2_to_hf, llama.rules, llama.PREFIX),
  GEMMA3: Converter(GEMMA3, "gemma3_text", gemma3_from_hf, gemma3_to_hf, llama.rules, llama.PREFIX),
}
