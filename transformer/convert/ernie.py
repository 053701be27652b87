"""ERNIE 4.5 dense (`Ernie4_5ForCausalLM`, ERNIE-4.5-0.3B): the Llama decoder with RoPE on
adjacent pairs (the query and key features reordered on import, `base.rope_interleaved`)
and biases on every projection or none (`use_bias`). The output is usually tied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, Rule, rope_interleaved
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Ernie4_5ForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = llama.common(hf, ARCHITECTURE, bool(hf.get("use_bias", False)))
  return fields | {"tie_embeddings": hf.get("tie_word_embeddings", True)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "ernie4_5", "use_bias": c.use_bias}
  for key in ("attention_bias", "mlp_bias"):
    del out[key]
  return out


def rules(c: ModelConfig) -> list[Rule]:
  return rope_interleaved(llama.rules(c), c.head_dim, c.rope_dim)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "ernie4_5", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}
