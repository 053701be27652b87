"""RoBERTa (`RobertaForMaskedLM`, `RobertaForSequenceClassification`): BERT's layout.

The backbone is BERT's (`convert.bert`: post-LN, embedding LayerNorm, token types, the same
layer tensors) under the prefix 'roberta.'; RoBERTa checkpoints have one token type
(`type_vocab_size=1`) and `layer_norm_eps=1e-5`, both read from config.json.

Positions: HF numbers the real tokens from `pad_token_id + 1` (the cumulative count of
tokens other than PAD, plus PAD; a PAD token gets row `pad_token_id`, which is zeros), so
`position_embeddings` has `max_position_embeddings` = our `max_len` + `pad_token_id` + 1
rows and ours are its rows from `pad_token_id + 1` on (the rule takes the rows beyond
`max_len`, which `config_from_hf` sets to exactly that). Export writes RoBERTa's ids
(PAD 1, BOS 0, EOS 2) and two zero rows before our table, so import(export) is bit for
bit. A checkpoint with another `pad_token_id` imports (its offset is that id + 1) but is
exported with PAD 1; its config.json's ids then need setting back by hand. Our model
numbers positions 0, 1, ... as given: for right padding the default positions agree with
HF's; for left padding pass HF-equal positions `cumsum(mask) - 1` (HF restarts after the
padding). Pass `segment_ids` (the attention mask) too: RoBERTa's <s> is id 0, which the
default `segment_ids` (tokens != 0) would take for padding.

Masked LM: `lm_head.dense` -> `mlm_transform` (RoBERTa's head is exact GELU whatever
`hidden_act` is, as ours), `lm_head.layer_norm` -> `mlm_norm`, `lm_head.bias` ->
`mlm_bias`, `lm_head.decoder` tied to the token embedding. With `tie_word_embeddings`
false HF ties neither the decoder weight nor its bias: the logits take
`lm_head.decoder.bias` (-> `mlm_bias`; `lm_head.bias` is unused and written equal to it)
and `lm_head.decoder.weight` (-> `mlm_head`). Classifier: `classifier.dense` (on <s>,
tanh) -> `pooler`, `classifier.out_proj` -> `classifier`; `classifier_dropout` is not
carried (training only: our pooled dropout is `dropout_rate`, HF's default).

Refused in one line: relative position embeddings, decoder use (`is_decoder`,
`add_cross_attention`), a `pad_token_id` that is not an id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from transformer.convert import bert
from transformer.convert.base import Converter, Rule, linear, norm
from transformer.nn.config import ModelConfig

MLM = "RobertaForMaskedLM"
CLASSIFIER = "RobertaForSequenceClassification"
PREFIX = "roberta."
PAD, BOS, EOS = 1, 0, 2  # RoBERTa's ids, written on export


def config_from_hf(architecture: str, hf: Mapping[str, Any]) -> dict[str, Any]:
  a = architecture
  pad = hf.get("pad_token_id", PAD)
  if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
    raise ValueError(f"{a}: pad_token_id={pad!r} is not supported (supported: a token id >= 0)")
  fields = bert.model_from_hf(hf, a, a == MLM)
  max_len = hf["max_position_embeddings"] - pad - 1  # the rows after PAD's
  if max_len < 1:
    raise ValueError(
      f"{a}: max_position_embeddings={hf['max_position_embeddings']} leaves no positions "
      f"after rows 0..{pad} (pad_token_id={pad})"
    )
  return {**fields, "max_len": max_len}


def config_to_hf(architecture: str, c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "roberta",
    **bert.model_to_hf(c, architecture, architecture == MLM),
    "max_position_embeddings": c.max_len + PAD + 1,
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
  }


def positions(c: ModelConfig) -> Callable[[str, str], Rule]:
  """The position table rule: HF's [pad + 1 + max_len, D] <-> our [max_len, D], its last
  `max_len` rows; export puts PAD + 1 zero rows before ours."""

  def rule(ours: str, hf: str) -> Rule:
    def to_ours(table):
      if table.shape[0] <= c.max_len:  # no padding rows: reported as a shape mismatch
        raise ValueError(f"{hf}: {table.shape[0]} rows, not more than max_len={c.max_len}")
      return (table[table.shape[0] - c.max_len :],)

    def to_hf(table):
      return (np.concatenate([np.zeros((PAD + 1, table.shape[1]), table.dtype), table]),)

    return Rule((ours,), (hf,), to_ours, to_hf)

  return rule


def backbone(c: ModelConfig) -> list[Rule]:
  return bert.backbone(c, PREFIX, positions(c))


def mlm_rules(c: ModelConfig) -> list[Rule]:
  out = backbone(c)
  out += linear("mlm_transform", "lm_head.dense")
  out += norm("mlm_norm", "lm_head.layer_norm")
  return out + bert.output_rules(c, "lm_head")


def classifier_rules(c: ModelConfig) -> list[Rule]:
  return (
    backbone(c) + linear("pooler", "classifier.dense") + linear("classifier", "classifier.out_proj")
  )


CONVERTERS = {
  name: Converter(
    name,
    "roberta",
    functools.partial(config_from_hf, name),
    functools.partial(config_to_hf, name),
    rules,
    PREFIX,
  )
  for name, rules in ((MLM, mlm_rules), (CLASSIFIER, classifier_rules))
}
