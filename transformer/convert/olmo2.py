"""OLMo 2 (`Olmo2ForCausalLM`): the Llama tensor layout with norms moved and widened.

- Each sublayer's output is normalised before the residual add, and its input is not:
  x + norm(attn(x)), then x + norm(mlp(x)) (`ModelConfig.norm_position='sublayer_post'`;
  `post_attention_layernorm` and `post_feedforward_layernorm` -> our `self_attention_norm`
  and `ffn_norm`), with a final norm.
- QK-norm over the whole projection: the N*H query features and the K*H key features are
  each RMS-normalised together, before RoPE (`qk_norm=True`, `qk_norm_over='projection'`;
  scales [N*H] and [K*H]).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, require
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Olmo2ForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  require(hf, ARCHITECTURE, "attention_bias", (False,))
  fields = llama.common(hf, ARCHITECTURE, False)
  return fields | {"norm_position": "sublayer_post", "qk_norm": True, "qk_norm_over": "projection"}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "olmo2"}
  del out["mlp_bias"]
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "olmo2", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}
