"""GPT-2 (`GPT2LMHeadModel`): learned positions, pre-LN, tanh GELU, tied embeddings.

GPT-2's `Conv1D` weights are already [in, out]; `c_attn` holds q, k and v side by side
([D, 3D]), which our model keeps as three [D, N, H] kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  activation,
  hf_activation,
  linear,
  norm,
  require,
  same,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "GPT2LMHeadModel"
PREFIX = "transformer."


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "add_cross_attention", (False,))
  scaled = require(hf, a, "scale_attn_weights", (True, False))
  d = hf["n_embd"]
  return {
    "family": "decoder",
    "vocab_size": hf["vocab_size"],
    "d_model": d,
    "num_heads": hf["n_head"],
    "num_kv_heads": None,
    "num_layers": hf["n_layer"],
    "d_ff": hf.get("n_inner") or 4 * d,
    "max_len": hf["n_positions"],
    "position": "learned",
    "norm": "layernorm",
    "norm_position": "pre",
    "norm_eps": hf.get("layer_norm_epsilon", 1e-5),
    "activation": activation(hf, a, "activation_function"),
    "use_bias": True,
    "tie_embeddings": hf.get("tie_word_embeddings", True),
    "type_vocab_size": 0,
    "dropout_rate": hf.get("resid_pdrop", 0.1),
    "attention_dropout_rate": hf.get("attn_pdrop", 0.1),
    **PLAIN,
    "attention_scale": None if scaled else 1.0,  # H**-0.5, or unscaled scores
    "attention_scale_by_layer": bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "gpt2",
    "vocab_size": c.vocab_size,
    "n_embd": c.d_model,
    "n_head": c.num_heads,
    "n_layer": c.num_layers,
    "n_inner": c.d_ff,
    "n_positions": c.max_len,
    "layer_norm_epsilon": c.norm_eps,
    "activation_function": hf_activation(c, ARCHITECTURE),
    "tie_word_embeddings": c.tie_embeddings,
    "resid_pdrop": c.dropout_rate,
    "embd_pdrop": c.dropout_rate,
    "attn_pdrop": c.attention_dropout_rate,
    "scale_attn_weights": c.attention_scale is None,
    "scale_attn_by_inverse_layer_idx": c.attention_scale_by_layer,
  }


def _qkv(ours: str, hf: str, c: ModelConfig) -> list[Rule]:
  """c_attn [D, 3D] (+ [3D]) <-> query, key, value kernels [D, N, H] (+ biases [N, H])."""
  n, h = c.num_heads, c.head_dim
  names = [f"{ours}/{p}" for p in ("query", "key", "value")]

  def kernels_to_ours(w):
    return tuple(part.reshape(w.shape[0], n, h) for part in np.split(w, 3, axis=1))

  def kernels_to_hf(*ks):
    return (np.concatenate([k.reshape(k.shape[0], n * h) for k in ks], axis=1),)

  def biases_to_ours(b):
    return tuple(part.reshape(n, h) for part in np.split(b, 3))

  def biases_to_hf(*bs):
    return (np.concatenate([b.reshape(n * h) for b in bs]),)

  return [
    Rule(tuple(f"{p}/kernel" for p in names), (f"{hf}.weight",), kernels_to_ours, kernels_to_hf),
    Rule(tuple(f"{p}/bias" for p in names), (f"{hf}.bias",), biases_to_ours, biases_to_hf),
  ]


def rules(c: ModelConfig) -> list[Rule]:
  n, h = c.num_heads, c.head_dim
  out = [
    same("token_embed/embedding", f"{PREFIX}wte.weight"),
    same("embedder/positions/embedding", f"{PREFIX}wpe.weight"),
  ]
  for i in range(c.num_layers):
    ours, hf = f"decoder/layer_{i}", f"{PREFIX}h.{i}"
    out += norm(f"{ours}/self_attention_norm", f"{hf}.ln_1")
    out += _qkv(f"{ours}/self_attention", f"{hf}.attn.c_attn", c)
    out.append(
      Rule(
        (f"{ours}/self_attention/out/kernel",),
        (f"{hf}.attn.c_proj.weight",),
        lambda w: (w.reshape(n, h, w.shape[-1]),),  # [N, H, D]
        lambda k: (k.reshape(n * h, k.shape[-1]),),  # [N*H, D]
      )
    )
    out.append(same(f"{ours}/self_attention/out/bias", f"{hf}.attn.c_proj.bias"))
    out += norm(f"{ours}/ffn_norm", f"{hf}.ln_2")
    for ffn, conv in (("wi", "c_fc"), ("wo", "c_proj")):  # Conv1D: [in, out] as our kernels
      out.append(same(f"{ours}/ffn/{ffn}/kernel", f"{hf}.mlp.{conv}.weight"))
      out.append(same(f"{ours}/ffn/{ffn}/bias", f"{hf}.mlp.{conv}.bias"))
  out += norm("decoder/final_norm", f"{PREFIX}ln_f")
  if not c.tie_embeddings:
    out += linear("lm_head", "lm_head", bias=False)
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(ARCHITECTURE, "gpt2", config_from_hf, config_to_hf, rules, PREFIX),
}
