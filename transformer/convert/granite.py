"""Granite (`GraniteForCausalLM`, IBM Granite 3.x dense): the Llama layout with four
multipliers.

- token embeddings times `embedding_multiplier` (`ModelConfig.embedding_multiplier`);
- each residual branch times `residual_multiplier` before the add (`residual_multiplier`);
- attention scores times `attention_multiplier` in place of H**-0.5 (`attention_scale`);
- logits divided by `logits_scaling` (`logits_multiplier` = 1 / logits_scaling).

Biases follow Llama's rule: on every projection or none (`attention_bias` = `mlp_bias`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter
from transformer.nn.config import ModelConfig

ARCHITECTURE = "GraniteForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = llama.config_from_hf(hf, ARCHITECTURE)
  scale = float(hf.get("attention_multiplier", 1.0))
  head_dim = fields["attention_head_dim"] or fields["d_model"] // fields["num_heads"]
  return fields | {
    "embedding_multiplier": float(hf.get("embedding_multiplier", 1.0)),
    "residual_multiplier": float(hf.get("residual_multiplier", 1.0)),
    "logits_multiplier": 1.0 / float(hf.get("logits_scaling", 1.0)),
    "attention_scale": None if scale == head_dim**-0.5 else scale,
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return llama.config_to_hf(c) | {
    "model_type": "granite",
    "embedding_multiplier": c.embedding_multiplier,
    "residual_multiplier": c.residual_multiplier,
    "logits_scaling": 1.0 / c.logits_multiplier,
    "attention_multiplier": c.head_dim**-0.5 if c.attention_scale is None else c.attention_scale,
  }


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "granite", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}
