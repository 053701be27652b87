"""Phi-3 (`Phi3ForCausalLM`): the Llama decoder with fused projections.

- `qkv_proj` [N*H + 2*K*H, D] holds the query, key and value projections one after
  another (no biases); it is split into our query [D, N, H], key and value [D, K, H].
- `gate_up_proj` [2F, D] holds the SwiGLU gate (our wi_0) then the up projection (wi_1).
- `partial_rotary_factor` (Phi-4-mini: 0.75) is `ModelConfig.rope_fraction`; the
  `sliding_window` of some checkpoints applies to every layer. The long-context
  checkpoints' `longrope` scaling is refused (in `llama.rope_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import llama
from transformer.convert.base import NO_TOKEN_IDS, Converter, Rule, heads_out, linear
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Phi3ForCausalLM"


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  fields = llama.common(hf, a, False, partial_rope=True)
  fields |= {"sliding_window": hf.get("sliding_window"), "dropout_rate": hf.get("resid_pdrop", 0.0)}
  return fields


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "phi3", "sliding_window": c.sliding_window}
  out |= {"resid_pdrop": c.dropout_rate, "embd_pdrop": c.dropout_rate}
  # Phi3Config's default token ids (32000, ...) would fall outside a smaller vocabulary;
  # the ids travel with the tokenizer files.
  out |= NO_TOKEN_IDS
  for key in ("attention_bias", "mlp_bias"):
    del out[key]
  return out


def _projections(c: ModelConfig, ours: str, hf: str) -> list[Rule]:
  n, k, h = c.num_heads, c.kv_heads, c.head_dim
  names = tuple(f"{ours}/{x}/kernel" for x in ("query", "key", "value"))

  def split(w):  # [N*H + 2*K*H, D] -> [D, N, H], [D, K, H], [D, K, H]
    q, key, v = np.split(w.T, [n * h, (n + k) * h], axis=1)
    d = w.shape[1]
    return q.reshape(d, n, h), key.reshape(d, k, h), v.reshape(d, k, h)

  def join(q, key, v):
    d = q.shape[0]
    return (np.concatenate([q.reshape(d, -1), key.reshape(d, -1), v.reshape(d, -1)], 1).T,)

  rule = Rule(names, (f"{hf}.qkv_proj.weight",), split, join)
  return [rule, *heads_out(f"{ours}/out", f"{hf}.o_proj", n, h, bias=False)]


def gate_up(c: ModelConfig, ours: str, hf: str, i: int) -> list[Rule]:
  names = (f"{ours}/ffn/wi_0/kernel", f"{ours}/ffn/wi_1/kernel")

  def split(w):  # [2F, D] -> gate [D, F], up [D, F]
    gate, up = np.split(w, 2, axis=0)
    return gate.T, up.T

  def join(gate, up):
    return (np.concatenate([gate.T, up.T], axis=0),)

  rule = Rule(names, (f"{hf}.mlp.gate_up_proj.weight",), split, join)
  return [rule, *linear(f"{ours}/ffn/wo", f"{hf}.mlp.down_proj", bias=False)]


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, gate_up, _projections)


CONVERTERS = {
  ARCHITECTURE: Converter(ARCHITECTURE, "phi3", config_from_hf, config_to_hf, rules, llama.PREFIX),
}
