"""StableLM (`StableLmForCausalLM`: StableLM 2, StableLM 3B-4E1T, StableCode): a Llama-like
decoder with LayerNorms and partial RoPE.

- LayerNorms with biases (`layer_norm_eps`), SwiGLU without biases, biases on the query,
  key and value projections when `use_qkv_bias` (`qkv_bias`).
- RoPE on the first `partial_rotary_factor` of each head (`rope_fraction`; 0.25).
- `use_parallel_residual`: x + attn(norm(x)) + mlp(norm(x)) with one norm
  (`parallel_residual`, `parallel_shared_norm`).
- `qk_layernorm` (StableLM 2 12B): each query and key head LayerNormed over its H features
  without a bias, with a scale of its own (`qk_norm`, `qk_norm_over='each_head'`: scales
  [N, H] and [K, H]; HF keeps one LayerNorm per head, `q_layernorm.norms.{n}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import llama
from transformer.convert.base import NO_TOKEN_IDS, Converter, Rule
from transformer.nn.config import ModelConfig

ARCHITECTURE = "StableLmForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  fields = llama.common(
    {**hf, "rms_norm_eps": hf.get("layer_norm_eps", 1e-5)}, a, False, partial_rope=True
  )
  parallel = bool(hf.get("use_parallel_residual", False))
  fields |= {"norm": "layernorm", "parallel_residual": parallel, "parallel_shared_norm": parallel}
  fields |= {"qkv_bias": hf.get("use_qkv_bias", False) or None}
  if hf.get("qk_layernorm", False):
    fields |= {"qk_norm": True, "qk_norm_over": "each_head"}
  return fields | {"dropout_rate": hf.get("hidden_dropout", 0.0)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "stablelm", "layer_norm_eps": c.norm_eps}
  out |= {"use_qkv_bias": c.qkv_biases, "use_parallel_residual": c.parallel_residual}
  out |= {"qk_layernorm": c.qk_norm, "hidden_dropout": c.dropout_rate} | NO_TOKEN_IDS
  out["rope_parameters"]["partial_rotary_factor"] = (
    c.rope_fraction
  )  # StableLmConfig's default: 0.25
  for key in ("attention_bias", "mlp_bias", "rms_norm_eps"):
    del out[key]
  return out


def _head_norms(ours: str, hf: str, heads: int) -> Rule:
  """One LayerNorm weight [H] per head (`hf.norms.{n}`) <-> our scale [N, H]."""
  names = tuple(f"{hf}.norms.{n}.weight" for n in range(heads))
  return Rule((f"{ours}/scale",), names, lambda *w: (np.stack(w),), lambda s: tuple(s))


def rules(c: ModelConfig) -> list[Rule]:
  norms = (("self_attention_norm", "input_layernorm"),) if c.parallel_shared_norm else None
  out = llama.decoder_rules(c.replace(qk_norm=False), llama.swiglu, norm_names=norms)
  if c.qk_norm:
    for i in range(c.num_layers):
      ours, hf = f"decoder/layer_{i}/self_attention", f"{llama.PREFIX}layers.{i}.self_attn"
      out.append(_head_norms(f"{ours}/query_head_norm", f"{hf}.q_layernorm", c.num_heads))
      out.append(_head_norms(f"{ours}/key_head_norm", f"{hf}.k_layernorm", c.kv_heads))
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "stablelm", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}
