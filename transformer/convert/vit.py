"""ViT (`ViTForImageClassification`): patch convolution, [CLS] token, pre-LN, linear head.

The patch convolution is [D, C, P, P] in PyTorch and [P, P, C, D] in Flax; images are
[B, C, H, W] there and [B, H, W, C] here, patches in the same row-major order.
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
  heads_in,
  heads_out,
  hf_activation,
  labels,
  linear,
  norm,
  num_labels,
  require,
  same,
  unsupported,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "ViTForImageClassification"
PREFIX = "vit."


def _side(hf: Mapping[str, Any], option: str) -> int:
  """A square side: an int, or [h, w] with h == w."""
  value = hf[option]
  if isinstance(value, list | tuple):
    if len(value) != 2 or value[0] != value[1]:
      unsupported(ARCHITECTURE, option, value, ("a square size",))
    value = value[0]
  return int(value)


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "qkv_bias", (True,))
  image, patch = _side(hf, "image_size"), _side(hf, "patch_size")
  return {
    "family": "vit",
    "d_model": hf["hidden_size"],
    "num_heads": hf["num_attention_heads"],
    "num_kv_heads": None,
    "num_layers": hf["num_hidden_layers"],
    "d_ff": hf["intermediate_size"],
    "max_len": (image // patch) ** 2 + 1,
    "image_size": image,
    "patch_size": patch,
    "num_channels": hf.get("num_channels", 3),
    "num_classes": num_labels(hf),
    "pooling": "cls",
    "position": "learned",
    "norm": "layernorm",
    "norm_position": "pre",
    "norm_eps": hf.get("layer_norm_eps", 1e-12),
    "activation": activation(hf, a, "hidden_act"),
    "use_bias": True,
    "dropout_rate": hf.get("hidden_dropout_prob", 0.0),
    "attention_dropout_rate": hf.get("attention_probs_dropout_prob", 0.0),
    **PLAIN,
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "vit",
    "hidden_size": c.d_model,
    "num_attention_heads": c.num_heads,
    "num_hidden_layers": c.num_layers,
    "intermediate_size": c.d_ff,
    "image_size": c.image_size,
    "patch_size": c.patch_size,
    "num_channels": c.num_channels,
    "layer_norm_eps": c.norm_eps,
    "hidden_act": hf_activation(c, ARCHITECTURE),
    "qkv_bias": True,
    "hidden_dropout_prob": c.dropout_rate,
    "attention_probs_dropout_prob": c.attention_dropout_rate,
    **labels(c.num_classes),
  }


def rules(c: ModelConfig) -> list[Rule]:
  n, h = c.num_heads, c.head_dim
  e = f"{PREFIX}embeddings"
  out = [
    same("cls", f"{e}.cls_token"),
    same("pos_embedding", f"{e}.position_embeddings"),
    Rule(
      ("patch_embed/kernel",),
      (f"{e}.patch_embeddings.projection.weight",),
      lambda w: (w.transpose(2, 3, 1, 0),),  # [D, C, P, P] -> [P, P, C, D]
      lambda k: (k.transpose(3, 2, 0, 1),),  # [P, P, C, D] -> [D, C, P, P]
    ),
    same("patch_embed/bias", f"{e}.patch_embeddings.projection.bias"),
  ]
  for i in range(c.num_layers):
    ours, hf = f"encoder/layer_{i}", f"{PREFIX}encoder.layer.{i}"
    for name in ("query", "key", "value"):
      out += heads_in(f"{ours}/self_attention/{name}", f"{hf}.attention.attention.{name}", n, h)
    out += heads_out(f"{ours}/self_attention/out", f"{hf}.attention.output.dense", n, h)
    out += norm(f"{ours}/self_attention_norm", f"{hf}.layernorm_before")
    out += norm(f"{ours}/ffn_norm", f"{hf}.layernorm_after")
    out += linear(f"{ours}/ffn/wi", f"{hf}.intermediate.dense")
    out += linear(f"{ours}/ffn/wo", f"{hf}.output.dense")
  return out + norm("encoder/final_norm", f"{PREFIX}layernorm") + linear("head", "classifier")


def init_inputs(c: ModelConfig) -> tuple[np.ndarray]:
  return (np.zeros((1, c.image_size, c.image_size, c.num_channels), np.float32),)  # [B, H, W, C]


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "vit", config_from_hf, config_to_hf, rules, PREFIX, init_inputs
  ),
}
