"""ViT (`ViTForImageClassification`): patch convolution, [CLS] token, pre-LN, linear head.

The patch convolution is [D, C, P, P] in PyTorch and [P, P, C, D] in Flax; images are
[B, C, H, W] there and [B, H, W, C] here, patches in the same row-major order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def side(hf: Mapping[str, Any], architecture: str, option: str) -> int:
  """A square side: an int, or [h, w] with h == w."""
  value = hf[option]
  if isinstance(value, list | tuple):
    if len(value) != 2 or value[0] != value[1]:
      unsupported(architecture, option, value, ("a square size",))
    value = value[0]
  return int(value)


def fields_from_hf(hf: Mapping[str, Any], architecture: str) -> dict[str, Any]:
  """The ModelConfig fields of a `ViTConfig`-style classifier (ViT; DeiT and DINOv2 add to
  them): the pre-LN stack, square images and patches, a learned position for [CLS] and
  each patch, [CLS] pooling, neither a distillation token nor layer scale."""
  require(hf, architecture, "qkv_bias", (True,))
  image, patch = side(hf, architecture, "image_size"), side(hf, architecture, "patch_size")
  return {
    **encoder_from_hf(hf, architecture, dropout=0.0),
    "family": "vit",
    "max_len": (image // patch) ** 2 + 1,
    "image_size": image,
    "patch_size": patch,
    "num_channels": hf.get("num_channels", 3),
    "num_classes": num_labels(hf),
    "pooling": "cls",
    "norm_position": "pre",
    "vit_distillation_token": False,
    "layer_scale_init": None,
  }


def fields_to_hf(c: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json fields of `fields_from_hf` (no `model_type`)."""
  return {
    **encoder_to_hf(c, architecture),
    "image_size": c.image_size,
    "patch_size": c.patch_size,
    "num_channels": c.num_channels,
    "qkv_bias": True,
    **labels(c.num_classes),
  }


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  return fields_from_hf(hf, ARCHITECTURE)


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {"model_type": "vit", **fields_to_hf(c, ARCHITECTURE)}


def embedding_rules(prefix: str, positions: Callable[[str, str], Rule] = same) -> list[Rule]:
  """[CLS], the position table (`positions(ours, hf)`; DINOv2's resamples it) and the patch
  convolution <-> '{prefix}embeddings.*'."""
  e = f"{prefix}embeddings"
  return [
    same("cls", f"{e}.cls_token"),
    positions("pos_embedding", f"{e}.position_embeddings"),
    Rule(
      ("patch_embed/kernel",),
      (f"{e}.patch_embeddings.projection.weight",),
      lambda w: (w.transpose(2, 3, 1, 0),),  # [D, C, P, P] -> [P, P, C, D]
      lambda k: (k.transpose(3, 2, 0, 1),),  # [P, P, C, D] -> [D, C, P, P]
    ),
    same("patch_embed/bias", f"{e}.patch_embeddings.projection.bias"),
  ]


def backbone(c: ModelConfig, prefix: str) -> list[Rule]:
  """Embeddings, layers and the final LayerNorm of a ViT-layout backbone ('vit.', DeiT's
  'deit.'): `layernorm_before` / `layernorm_after` around each sublayer."""
  out = embedding_rules(prefix)
  for i in range(c.num_layers):
    ours, hf = f"encoder/layer_{i}", f"{prefix}encoder.layer.{i}"
    out += layer_rules(ours, hf, c, "attention", ("layernorm_before", "layernorm_after"))
  return out + norm("encoder/final_norm", f"{prefix}layernorm")


def rules(c: ModelConfig) -> list[Rule]:
  return backbone(c, PREFIX) + linear("head", "classifier")


def init_inputs(c: ModelConfig) -> tuple[np.ndarray]:
  return (np.zeros((1, c.image_size, c.image_size, c.num_channels), np.float32),)  # [B, H, W, C]


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "vit", config_from_hf, config_to_hf, rules, PREFIX, init_inputs
  ),
}
