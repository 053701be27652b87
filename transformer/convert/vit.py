"""ViT (`ViTForImageClassification`): patch convolution, [CLS] token, pre-LN, linear head.

The patch convolution is [D, C, P, P] in PyTorch and [P, P, C, D] in Flax; images are
[B, C, H, W] there and [B, H, W, C] here, patches in the same row-major order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert.base import (
  Converter,
  Rule,
  labels,
  linear,
  norm,
  num_labels,
  require,
  same,
  unsupported,
)
from transformer.convert.bert import encoder_from_hf, encoder_to_hf, layer_rules
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
    **encoder_from_hf(hf, a, dropout=0.0),
    "family": "vit",
    "max_len": (image // patch) ** 2 + 1,
    "image_size": image,
    "patch_size": patch,
    "num_channels": hf.get("num_channels", 3),
    "num_classes": num_labels(hf),
    "pooling": "cls",
    "norm_position": "pre",
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "vit",
    **encoder_to_hf(c, ARCHITECTURE),
    "image_size": c.image_size,
    "patch_size": c.patch_size,
    "num_channels": c.num_channels,
    "qkv_bias": True,
    **labels(c.num_classes),
  }


def rules(c: ModelConfig) -> list[Rule]:
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
    out += layer_rules(ours, hf, c, "attention", ("layernorm_before", "layernorm_after"))
  return out + norm("encoder/final_norm", f"{PREFIX}layernorm") + linear("head", "classifier")


def init_inputs(c: ModelConfig) -> tuple[np.ndarray]:
  return (np.zeros((1, c.image_size, c.image_size, c.num_channels), np.float32),)  # [B, H, W, C]


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "vit", config_from_hf, config_to_hf, rules, PREFIX, init_inputs
  ),
}
