"""Model families, one per file, all built from `transformer.nn.blocks`.

`FAMILIES` maps `ModelConfig.family` to what the rest of the library needs of a family:
its module (`build`), its extra validation, its parameter count and its FLOPs.
  decoder -> DecoderLM; encoder -> MaskedLM (num_classes == 0) or SequenceClassifier;
  seq2seq -> EncoderDecoder; vit -> VisionTransformer.
A new family is one file here and one entry below.

`check(config)` applies the rules that depend on the registries (the family, the position
encoding, the ops and the fused attention kernels) on top of the field rules `ModelConfig`
checks itself; `build_model` calls it, and a run calls it once where its config is read.
`param_count` and `flops_per_token` dispatch to the family (shared arithmetic: `counts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn

from transformer.nn.config import ModelConfig, fail
from transformer.nn.kernel_rules import FUSED, fused_attention_problem
from transformer.nn.models import decoder, encoder, seq2seq, vit
from transformer.nn.models.decoder import DecoderLM
from transformer.nn.models.encoder import MaskedLM, SequenceClassifier, TransformerEncoder
from transformer.nn.models.seq2seq import EncoderDecoder
from transformer.nn.models.vit import VisionTransformer
from transformer.nn.positions import POSITIONS
from transformer.ops import OPS


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


def check(config: ModelConfig) -> ModelConfig:
  """`config`, after the registries' rules: raises the one-line `ValueError` naming the
  field (`config.fail`) for a family, position or ops that does not exist, a family's or
  position encoding's own rules, and a fused attention kernel the config cannot use."""
  for field, options in (("family", FAMILIES), ("position", POSITIONS), ("ops", OPS)):
    value = getattr(config, field)
    if not isinstance(value, str) or value not in options:
      fail(field, value, f"must be one of {', '.join(options)}")
  POSITIONS[config.position](config).validate()
  FAMILIES[config.family].validate(config)
  if config.attention_impl in FUSED:
    problem = fused_attention_problem(config, config.attention_impl)
    if problem:
      fail("attention_impl", config.attention_impl, f"{problem}; use 'auto'")
  return config


def build_model(config: ModelConfig) -> nn.Module:
  """The model `config` describes (see the module docstring for the mapping)."""
  return FAMILIES[check(config).family].build(config)


def param_count(c: ModelConfig) -> int:
  """Exact number of parameters of the model `c` builds (see tests/test_param_count.py).

  LoRA adapters (`lora_rank` > 0) are not counted: this is the model they merge into
  (`lora.merge_lora`); `lora.adapter_params(params)` counts them."""
  return FAMILIES[c.family].param_count(c)


def flops_per_token(
  c: ModelConfig, seq_len: int, training: bool = True, mlm_predictions: int | None = None
) -> float:
  """Matmul FLOPs per token (2 per multiply-add), forward or forward+backward (x3).

  Counts every projection, the feed-forward, the output logits (or classifier) and the
  attention score and value products (4 * keys * N * H per layer and token, keys the ones a
  query attends to: T bidirectional, T / 2 causal (MaxText's convention), a window's band;
  `counts.attended_keys`). Norms, softmax and elementwise
  work are excluded. A mixture-of-experts layer counts its active FLOPs (router + top-k
  experts, `counts.layer_flops`).
  `mlm_predictions`: the encoder's MLM head runs at that many of every `seq_len` positions
  (the train step's `mlm_max_predictions`) instead of all of them.
  """
  forward = FAMILIES[c.family].forward_flops(c, seq_len, mlm_predictions)
  return 3.0 * forward if training else float(forward)


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
  "check",
  "flops_per_token",
  "param_count",
]
