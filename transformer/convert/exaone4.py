"""EXAONE 4.0 (`Exaone4ForCausalLM`): OLMo 2's block with Qwen3's QK-norm, local and global
layers, and RoPE on the local layers only.

- Each sublayer's output is normalised before the residual add (`norm_position=
  'sublayer_post'`), and each query and key head is RMS-normalised over its H features
  before RoPE (`qk_norm`, scales [H]).
- With a `sliding_window`, `layer_types` (by default three local layers per global one)
  -> `local_global_pattern`, and only the local layers rotate their queries and keys
  (`rope_pattern` 'RRRN'); without one, every layer is global with RoPE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import cohere2, llama
from transformer.convert.base import NO_TOKEN_IDS, Converter, layer_types, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Exaone4ForCausalLM"


def _types(hf: Mapping[str, Any]) -> list[str]:
  """`layer_types`, or those of the legacy `sliding_window_pattern` (an int period or 'LLLG')."""
  if hf.get("layer_types"):
    return hf["layer_types"]
  pattern = hf.get("sliding_window_pattern", 4)
  if isinstance(pattern, int):
    pattern = "L" * (pattern - 1) + "G"
  if not isinstance(pattern, str) or not pattern or set(pattern) - {"L", "G"}:
    unsupported(ARCHITECTURE, "sliding_window_pattern", pattern, ("an int > 0", "'L'/'G' string"))
  kinds = {"L": "sliding_attention", "G": "full_attention"}
  return [kinds[pattern[i % len(pattern)]] for i in range(hf["num_hidden_layers"])]


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  fields = llama.common(hf, a, False) | {"norm_position": "sublayer_post", "qk_norm": True}
  if hf.get("sliding_window") is None:  # every layer global, with RoPE
    return fields
  return fields | cohere2.local_fields(hf, a, _types(hf))


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "exaone4", "layer_types": layer_types(c)}
  out |= {"sliding_window": c.sliding_window, "sliding_window_pattern": None} | NO_TOKEN_IDS
  for key in ("attention_bias", "mlp_bias"):
    del out[key]
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "exaone4", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}
