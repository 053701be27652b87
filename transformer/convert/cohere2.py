"""Command R7B / Command A (`Cohere2ForCausalLM`): a parallel block with one LayerNorm,
local and global layers, and RoPE on the local layers only.

- x + attn(norm(x)) + mlp(norm(x)) with one norm (`parallel_residual`,
  `parallel_shared_norm`), LayerNorms without biases (`norm_bias=False`), SwiGLU.
- `layer_types` (by default three local layers per global one) -> `local_global_pattern`;
  the local layers rotate their queries and keys, the global ones have no position
  encoding (`rope_pattern`, 'RRRN'), as HF applies RoPE only under a sliding window.
- RoPE on adjacent pairs: the query and key features are reordered on import
  (`base.rope_interleaved`).
- Logits times `logit_scale` (`logits_multiplier`); the output is tied.

`attention_bias=True` (biases on attention only) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import (
  NO_TOKEN_IDS,
  Converter,
  Rule,
  layer_pattern,
  layer_types,
  require,
  rope_interleaved,
  shortest_period,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Cohere2ForCausalLM"


def local_fields(hf: Mapping[str, Any], a: str, types: list[str]) -> dict[str, Any]:
  """The window fields of a family whose global layers have no position encoding (Cohere 2,
  EXAONE 4): `local_global_pattern`, `sliding_window` and `rope_pattern` from `types`."""
  pattern = layer_pattern(a, types, hf["num_hidden_layers"])
  full = "".join("R" if t == "sliding_attention" else "N" for t in types)
  return {
    "local_global_pattern": "" if pattern == "G" else pattern,
    "sliding_window": hf["sliding_window"] if "L" in pattern else None,
    "rope_pattern": "" if "N" not in full else shortest_period(full),
  }


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "attention_bias", (False,))
  fields = llama.common({**hf, "rms_norm_eps": hf.get("layer_norm_eps", 1e-5)}, a, False)
  fields |= {"norm": "layernorm", "norm_bias": False, "parallel_residual": True}
  fields |= {"parallel_shared_norm": True, "tie_embeddings": hf.get("tie_word_embeddings", True)}
  fields |= {"logits_multiplier": float(hf.get("logit_scale", 0.0625))}
  return fields | local_fields(hf, a, hf["layer_types"])


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "cohere2", "layer_norm_eps": c.norm_eps}
  out |= {"logit_scale": c.logits_multiplier, "layer_types": layer_types(c)}
  out |= {"sliding_window": c.sliding_window} | NO_TOKEN_IDS
  for key in ("mlp_bias", "rms_norm_eps"):
    del out[key]
  return out


def rules(c: ModelConfig) -> list[Rule]:
  norms = (("self_attention_norm", "input_layernorm"),)
  return rope_interleaved(
    llama.decoder_rules(c, llama.swiglu, norm_names=norms), c.head_dim, c.rope_dim
  )


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "cohere2", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}
