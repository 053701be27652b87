"""Model families, one per file, all built from `transformer.nn.blocks`.

`build_model(config)` picks the class for `config.family`:
  decoder -> DecoderLM; encoder -> MaskedLM (num_classes == 0) or SequenceClassifier;
  seq2seq -> EncoderDecoder; vit -> VisionTransformer.
"""

from __future__ import annotations

import flax.linen as nn

from transformer.nn.config import ModelConfig
from transformer.nn.models.decoder import DecoderLM
from transformer.nn.models.encoder import MaskedLM, SequenceClassifier, TransformerEncoder
from transformer.nn.models.seq2seq import EncoderDecoder
from transformer.nn.models.vit import VisionTransformer

__all__ = [
  "DecoderLM",
  "EncoderDecoder",
  "MaskedLM",
  "SequenceClassifier",
  "TransformerEncoder",
  "VisionTransformer",
  "build_model",
]


def build_model(config: ModelConfig) -> nn.Module:
  """The model `config` describes (see the module docstring for the mapping)."""
  if config.family == "decoder":
    return DecoderLM(config)
  if config.family == "seq2seq":
    return EncoderDecoder(config)
  if config.family == "vit":
    return VisionTransformer(config)
  return SequenceClassifier(config) if config.num_classes else MaskedLM(config)
