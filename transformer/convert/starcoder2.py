"""StarCoder 2 (`Starcoder2ForCausalLM`): the Mistral attention (RoPE, grouped-query heads,
a sliding window on every layer or none) in a GPT-style block: LayerNorms with biases, a
plain two-layer feed-forward (`c_fc`, `c_proj` -> our `ffn/wi`, `ffn/wo`) with tanh GELU,
and biases on every projection when `use_bias`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import NO_TOKEN_IDS, Converter, Rule, linear
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Starcoder2ForCausalLM"
GELU = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf = {**hf, "rms_norm_eps": hf.get("norm_epsilon", 1e-5)}
  fields = llama.common(hf, ARCHITECTURE, bool(hf.get("use_bias", True)), GELU)
  return fields | {
    "norm": "layernorm",
    "sliding_window": hf.get("sliding_window"),
    "dropout_rate": hf.get("residual_dropout", 0.0),
    "tie_embeddings": hf.get("tie_word_embeddings", True),
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "starcoder2", "use_bias": c.use_bias}
  act = next(k for k, v in GELU.items() if v == c.activation)
  out |= {"hidden_act": act, "norm_epsilon": c.norm_eps, "sliding_window": c.sliding_window}
  out |= {"residual_dropout": c.dropout_rate, "embedding_dropout": c.dropout_rate}
  out |= NO_TOKEN_IDS  # the ids travel with the tokenizer files
  for key in ("attention_bias", "mlp_bias", "rms_norm_eps"):
    del out[key]
  return out


def _mlp(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  out = linear(f"{ours}/ffn/wi", f"{hf}.mlp.c_fc", c.use_bias)
  return out + linear(f"{ours}/ffn/wo", f"{hf}.mlp.c_proj", c.use_bias)


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, _mlp)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "starcoder2", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}
