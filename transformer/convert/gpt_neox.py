"""GPT-NeoX and Pythia (`GPTNeoXForCausalLM`): pre-LN LayerNorm, GELU, biases everywhere,
RoPE on part of each head, and attention and feed-forward in parallel.

- Parallel residual (`use_parallel_residual`, every Pythia): x + attn(ln1(x)) +
  mlp(ln2(x)) (`ModelConfig.parallel_residual`); without it the usual sequential pre-LN.
- Partial rotary: only the first `rotary_pct` (transformers 5: `partial_rotary_factor`)
  of each head's features rotate, with the frequencies of a head that wide
  (`ModelConfig.rope_fraction`).
- The fused `query_key_value` projection [N*3*H, D] is head-major: its outputs are, per
  head n, that head's H query, H key and H value features (`view(..., N, 3H)` then
  `chunk(3)` in Hugging Face). It is split here into our query, key and value [D, N, H].
- The output projection is `embed_out`, untied unless `tie_word_embeddings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import llama
from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  activation,
  heads_out,
  hf_activation,
  linear,
  norm,
  require,
  same,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "GPTNeoXForCausalLM"
PREFIX = "gpt_neox."


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "attention_bias", (True,))  # the feed-forward always has biases
  return {
    **PLAIN,  # first: the fields below may set some of them
    "family": "decoder",
    "vocab_size": hf["vocab_size"],
    "d_model": hf["hidden_size"],
    "num_heads": hf["num_attention_heads"],
    "num_layers": hf["num_hidden_layers"],
    "d_ff": hf["intermediate_size"],
    "max_len": hf["max_position_embeddings"],
    "position": "rope",
    **llama.rope_fields(hf, a, partial=True),
    "norm": "layernorm",
    "norm_position": "pre",
    "norm_eps": hf.get("layer_norm_eps", 1e-5),
    "parallel_residual": bool(hf.get("use_parallel_residual", True)),
    "activation": activation(hf, a, "hidden_act"),
    "use_bias": True,
    "tie_embeddings": hf.get("tie_word_embeddings", False),
    "type_vocab_size": 0,
    "dropout_rate": hf.get("hidden_dropout", 0.0),
    "attention_dropout_rate": hf.get("attention_dropout", 0.0),
    "num_kv_heads": None,
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "gpt_neox",
    "vocab_size": c.vocab_size,
    "hidden_size": c.d_model,
    "num_attention_heads": c.num_heads,
    "num_hidden_layers": c.num_layers,
    "intermediate_size": c.d_ff,
    "max_position_embeddings": c.max_len,
    "rope_parameters": llama.rope_to_hf(c) | {"partial_rotary_factor": c.rope_fraction},
    "layer_norm_eps": c.norm_eps,
    "use_parallel_residual": c.parallel_residual,
    "hidden_act": hf_activation(c, ARCHITECTURE),
    "attention_bias": True,
    "tie_word_embeddings": c.tie_embeddings,
    "hidden_dropout": c.dropout_rate,
    "attention_dropout": c.attention_dropout_rate,
  }


def fused_qkv(ours: str, hf: str, heads: int, head_dim: int) -> list[Rule]:
  """`hf` [N*3*H, D] (+ bias [N*3*H]), head-major q|k|v <-> `ours`/{query,key,value}
  kernels [D, N, H] (+ biases [N, H])."""
  names = [f"{ours}/{x}" for x in ("query", "key", "value")]

  def kernels(w):
    k = w.T.reshape(w.shape[1], heads, 3, head_dim)  # [D, N, 3, H]
    return k[:, :, 0], k[:, :, 1], k[:, :, 2]

  def weight(q, k, v):
    return (np.stack([q, k, v], axis=2).reshape(q.shape[0], -1).T,)  # [N*3*H, D]

  def biases(b):
    b = b.reshape(heads, 3, head_dim)  # [N, 3, H]
    return b[:, 0], b[:, 1], b[:, 2]

  def bias(q, k, v):
    return (np.stack([q, k, v], axis=1).reshape(-1),)  # [N*3*H]

  return [
    Rule(tuple(f"{n}/kernel" for n in names), (f"{hf}.weight",), kernels, weight),
    Rule(tuple(f"{n}/bias" for n in names), (f"{hf}.bias",), biases, bias),
  ]


def rules(c: ModelConfig) -> list[Rule]:
  out = [same("token_embed/embedding", f"{PREFIX}embed_in.weight")]
  for i in range(c.num_layers):
    ours, hf = f"decoder/layer_{i}", f"{PREFIX}layers.{i}"
    attn = f"{ours}/self_attention"
    out += fused_qkv(attn, f"{hf}.attention.query_key_value", c.num_heads, c.head_dim)
    out += heads_out(f"{attn}/out", f"{hf}.attention.dense", c.num_heads, c.head_dim)
    out += norm(f"{ours}/self_attention_norm", f"{hf}.input_layernorm")
    out += norm(f"{ours}/ffn_norm", f"{hf}.post_attention_layernorm")
    out += linear(f"{ours}/ffn/wi", f"{hf}.mlp.dense_h_to_4h")
    out += linear(f"{ours}/ffn/wo", f"{hf}.mlp.dense_4h_to_h")
  out += norm("decoder/final_norm", f"{PREFIX}final_layer_norm")
  if not c.tie_embeddings:
    out += linear("lm_head", "embed_out", bias=False)
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(ARCHITECTURE, "gpt_neox", config_from_hf, config_to_hf, rules, PREFIX),
}
