"""Named model sizes from the papers, each citing its source, and the gated-FFN sizing rule."""

from __future__ import annotations

import math
from typing import Any

from transformer.nn.config import ModelConfig


def gated_hidden_size(d_model: int, multiple_of: int = 256) -> int:
  """The 2/3 rule: a gated unit with 3 matrices matches a 4*D two-matrix FFN's parameters.

  F = 2/3 * 4 * D, rounded up to a multiple of `multiple_of` (Shazeer 2020; LLaMA).
  """
  hidden = int(2 * 4 * d_model / 3)
  return multiple_of * math.ceil(hidden / multiple_of)


def _shape(d_model: int, num_heads: int, num_layers: int, d_ff: int) -> dict[str, int]:
  return dict(d_model=d_model, num_heads=num_heads, num_layers=num_layers, d_ff=d_ff)


# Vaswani et al. 2017, Table 3 (shared 37000 BPE vocabulary, post-LN, ReLU, sinusoidal).
_TRANSFORMER = dict(
  family="seq2seq",
  vocab_size=37000,
  max_len=256,
  position="sinusoidal",
  norm_position="post",
  activation="relu",
  scale_embeddings=True,
  tie_embeddings=True,
)
# Devlin et al. 2019, Section 3 (WordPiece 30522 vocabulary, 512 positions, 2 segments).
_BERT = dict(
  family="encoder",
  vocab_size=30522,
  max_len=512,
  position="learned",
  norm_position="post",
  activation="gelu",
  type_vocab_size=2,
  norm_eps=1e-12,
  dropout_rate=0.1,
  attention_dropout_rate=0.1,
)
# Radford et al. 2019, Table 2 (vocabulary 50257, context 1024, tied embeddings).
_GPT2 = dict(
  family="decoder",
  vocab_size=50257,
  max_len=1024,
  position="learned",
  activation="gelu",
  dropout_rate=0.1,
  attention_dropout_rate=0.1,
)
# Dosovitskiy et al. 2021, Table 1 (B, L); Touvron et al. 2021, Table 1 (Ti, S).
# ImageNet at 224 px, 1000 classes, [CLS] pooling, learned positions.
_VIT = dict(
  family="vit",
  image_size=224,
  num_classes=1000,
  position="learned",
  activation="gelu",
  norm_eps=1e-6,
  pooling="cls",
)


def _patches(patch: int) -> dict[str, int]:
  return dict(patch_size=patch, max_len=(_VIT["image_size"] // patch) ** 2 + 1)  # + [CLS]


# Named sizes. Each entry overrides ModelConfig defaults; the source is cited above.
NAMED_SIZES: dict[str, dict[str, Any]] = {
  "transformer_base": {**_TRANSFORMER, **_shape(512, 8, 6, 2048), "dropout_rate": 0.1},
  "transformer_big": {**_TRANSFORMER, **_shape(1024, 16, 6, 4096), "dropout_rate": 0.3},
  "bert_base": {**_BERT, **_shape(768, 12, 12, 3072)},
  "bert_large": {**_BERT, **_shape(1024, 16, 24, 4096)},
  "gpt2_small": {**_GPT2, **_shape(768, 12, 12, 3072)},
  "gpt2_medium": {**_GPT2, **_shape(1024, 16, 24, 4096)},
  "gpt2_large": {**_GPT2, **_shape(1280, 20, 36, 5120)},
  **{
    f"vit_{name}/{patch}": {**_VIT, **_shape(d, n, l, f), **_patches(patch)}
    for name, d, n, l, f in (
      ("ti", 192, 3, 12, 768),
      ("s", 384, 6, 12, 1536),
      ("b", 768, 12, 12, 3072),
      ("l", 1024, 16, 24, 4096),
    )
    for patch in ((16, 32) if name in ("b", "l") else (16,))
  },
}


def named(name: str, **overrides: Any) -> ModelConfig:
  """A named size, optionally with overrides: `named('gpt2_small', dropout_rate=0.0)`."""
  if name not in NAMED_SIZES:
    raise ValueError(f"unknown model size {name!r}; known: {', '.join(sorted(NAMED_SIZES))}")
  return ModelConfig(**{**NAMED_SIZES[name], **overrides})
