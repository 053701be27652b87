"""Model families, one per file, all built from `transformer.nn.blocks`.

`FAMILIES` maps `ModelConfig.family` to what the rest of the library needs of a family:
its module (`build`), its extra validation, its parameter count and its FLOPs.
  decoder -> DecoderLM; encoder -> MaskedLM (num_classes == 0) or SequenceClassifier;
  seq2seq -> EncoderDecoder; vit -> VisionTransformer.
A new family is one file here and one entry below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn

from transformer.nn.config import ModelConfig
from transformer.nn.models import decoder, encoder, seq2seq, vit
from transformer.nn.models.decoder import DecoderLM
from transformer.nn.models.encoder import MaskedLM, SequenceClassifier, TransformerEncoder
from transformer.nn.models.seq2seq import EncoderDecoder
from transformer.nn.models.vit import VisionTransformer


@dataclasses.dataclass(frozen=True)
class Family:
  """What one model family provides; each entry is a function of the whole config."""

  build: Callable[[ModelConfig], nn.Module]  # the Flax module
  validate: Callable[[ModelConfig], None]  # family rules, raising `config.fail`
  param_count: Callable[[ModelConfig], int]  # exact parameter count
  forward_flops: Callable[[ModelConfig, int, int | None], float]  # per token, forward


def _family(module) -> Family:
  return Family(module.build, module.validate, module.param_count, module.forward_flops)


FAMILIES: dict[str, Family] = {
  "encoder": _family(encoder),
  "decoder": _family(decoder),
  "seq2seq": _family(seq2seq),
  "vit": _family(vit),
}


def build_model(config: ModelConfig) -> nn.Module:
  """The model `config` describes (see the module docstring for the mapping)."""
  return FAMILIES[config.family].build(config)


__all__ = [
  "FAMILIES",
  "DecoderLM",
  "EncoderDecoder",
  "Family",
  "MaskedLM",
  "SequenceClassifier",
  "TransformerEncoder",
  "VisionTransformer",
  "build_model",
]
