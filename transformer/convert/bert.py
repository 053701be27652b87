"""BERT (`BertForMaskedLM`, `BertForSequenceClassification`): post-LN, token types.

The masked-LM head is BERT's transform (dense, exact GELU, LayerNorm), the output tied to
the token embedding, and an output bias; the classifier is the [CLS] pooler (dense, tanh)
and a linear layer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  activation,
  attention,
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

MLM = "BertForMaskedLM"
CLASSIFIER = "BertForSequenceClassification"
PREFIX = "bert."

# What ViT shares with BERT: the `BertConfig` fields of the encoder stack and the
# tensors of a layer.


def encoder_from_hf(hf: Mapping[str, Any], architecture: str, dropout: float) -> dict[str, Any]:
  """The ModelConfig fields of a `BertConfig`-style encoder stack: sizes, biased LayerNorm
  layers, the activation, and the dropout rates (HF's default: `dropout`)."""
  return {
    "activation": activation(hf, architecture, "hidden_act"),
    "d_model": hf["hidden_size"],
    "num_heads": hf["num_attention_heads"],
    "num_kv_heads": None,
    "num_layers": hf["num_hidden_layers"],
    "d_ff": hf["intermediate_size"],
    "position": "learned",
    "norm": "layernorm",
    "norm_eps": hf.get("layer_norm_eps", 1e-12),
    "use_bias": True,
    "dropout_rate": hf.get("hidden_dropout_prob", dropout),
    "attention_dropout_rate": hf.get("attention_probs_dropout_prob", dropout),
    **PLAIN,
  }


def encoder_to_hf(c: ModelConfig, architecture: str) -> dict[str, Any]:
  """The `BertConfig`-style config.json fields of `encoder_from_hf`."""
  return {
    "hidden_size": c.d_model,
    "num_attention_heads": c.num_heads,
    "num_hidden_layers": c.num_layers,
    "intermediate_size": c.d_ff,
    "layer_norm_eps": c.norm_eps,
    "hidden_act": hf_activation(c, architecture),
    "hidden_dropout_prob": c.dropout_rate,
    "attention_probs_dropout_prob": c.attention_dropout_rate,
  }


def layer_rules(ours: str, hf: str, c: ModelConfig, qkv: str, norms: tuple[str, str]) -> list[Rule]:
  """Our encoder layer `ours` <-> HF's layer `hf`: self-attention
  `attention.{qkv}.{query,key,value}` and `attention.output.dense` (`qkv`: 'self' in BERT,
  'attention' in ViT), FFN `intermediate.dense` and `output.dense`, and the LayerNorms
  `norms` of the attention and FFN sub-layers (BERT's after them, ViT's before)."""
  a = f"{hf}.attention"
  projections = (f"{a}.{qkv}.query", f"{a}.{qkv}.key", f"{a}.{qkv}.value", f"{a}.output.dense")
  return [
    *attention(f"{ours}/self_attention", projections, c.num_heads, c.head_dim),
    *norm(f"{ours}/self_attention_norm", f"{hf}.{norms[0]}"),
    *linear(f"{ours}/ffn/wi", f"{hf}.intermediate.dense"),
    *linear(f"{ours}/ffn/wo", f"{hf}.output.dense"),
    *norm(f"{ours}/ffn_norm", f"{hf}.{norms[1]}"),
  ]


def model_from_hf(hf: Mapping[str, Any], architecture: str, mlm: bool) -> dict[str, Any]:
  """The ModelConfig fields of a `BertConfig`-layout model (BERT, RoBERTa): the post-LN
  encoder stack, `max_position_embeddings` positions, token types, and the tying of the
  masked-LM head (`mlm`) or the classes of the [CLS] classifier."""
  a = architecture
  require(hf, a, "position_embedding_type", ("absolute",))
  require(hf, a, "is_decoder", (False,))
  require(hf, a, "add_cross_attention", (False,))
  fields = {
    **encoder_from_hf(hf, a, dropout=0.1),
    "family": "encoder",
    "vocab_size": hf["vocab_size"],
    "max_len": hf["max_position_embeddings"],
    "type_vocab_size": hf.get("type_vocab_size", 2),
    "norm_position": "post",
  }
  if mlm:
    return {**fields, "num_classes": 0, "tie_embeddings": hf.get("tie_word_embeddings", True)}
  return {**fields, "num_classes": num_labels(hf), "pooling": "cls"}


def model_to_hf(c: ModelConfig, architecture: str, mlm: bool) -> dict[str, Any]:
  """The `BertConfig`-layout config.json fields of `model_from_hf` (no `model_type`, ids)."""
  out = {
    "vocab_size": c.vocab_size,
    **encoder_to_hf(c, architecture),
    "max_position_embeddings": c.max_len,
    "type_vocab_size": c.type_vocab_size,
    "position_embedding_type": "absolute",
  }
  if mlm:
    return {**out, "tie_word_embeddings": c.tie_embeddings}
  return {**out, **labels(c.num_classes)}


def config_from_hf(architecture: str, hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = model_from_hf(hf, architecture, architecture == MLM)
  # Our MLM transform is BERT's exact GELU, whatever the FFN uses.
  if architecture == MLM and fields["activation"] != "gelu":
    unsupported(architecture, "hidden_act", hf["hidden_act"], ("gelu",))
  return fields


def config_to_hf(architecture: str, c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "bert",
    **model_to_hf(c, architecture, architecture == MLM),
    "pad_token_id": 0,
  }


def backbone(
  c: ModelConfig, prefix: str = PREFIX, positions: Callable[[str, str], Rule] = same
) -> list[Rule]:
  """Embeddings and layers: our 'encoder/...' (+ 'token_embed') <-> '{prefix}embeddings' and
  '{prefix}encoder' ('bert.'; RoBERTa's 'roberta.'); `positions(ours, hf)` gives the rule
  of the position table (`same`; RoBERTa's leaves out its padding rows)."""
  e = f"{prefix}embeddings"
  out = [
    same("token_embed/embedding", f"{e}.word_embeddings.weight"),
    positions("encoder/embedder/positions/embedding", f"{e}.position_embeddings.weight"),
    same("encoder/token_type_embed/embedding", f"{e}.token_type_embeddings.weight"),
    *norm("encoder/embed_norm", f"{e}.LayerNorm"),
  ]
  for i in range(c.num_layers):
    ours, hf = f"encoder/layers/layer_{i}", f"{prefix}encoder.layer.{i}"
    out += layer_rules(ours, hf, c, "self", ("attention.output.LayerNorm", "output.LayerNorm"))
  return out


def output_rules(c: ModelConfig, head: str) -> list[Rule]:
  """The masked-LM output of head `head` ('cls.predictions', RoBERTa's 'lm_head'): tied,
  its bias `head`.bias (HF ties the decoder's bias to it); untied, HF ties neither, and
  the logits take the decoder's weight and bias (`head`.bias, unused, is written equal)."""
  if c.tie_embeddings:
    return [same("mlm_bias", f"{head}.bias")]
  bias = Rule(
    ("mlm_bias",),
    (f"{head}.decoder.bias", f"{head}.bias"),
    lambda decoder_bias, _: (decoder_bias,),
    lambda b: (b, b),
  )
  return [*linear("mlm_head", f"{head}.decoder", bias=False), bias]


def mlm_rules(c: ModelConfig) -> list[Rule]:
  out = backbone(c)
  out += linear("mlm_transform", "cls.predictions.transform.dense")
  out += norm("mlm_norm", "cls.predictions.transform.LayerNorm")
  return out + output_rules(c, "cls.predictions")


def classifier_rules(c: ModelConfig) -> list[Rule]:
  return (
    backbone(c) + linear("pooler", f"{PREFIX}pooler.dense") + linear("classifier", "classifier")
  )


def _converter(architecture: str, rules) -> Converter:
  return Converter(
    architecture,
    "bert",
    functools.partial(config_from_hf, architecture),
    functools.partial(config_to_hf, architecture),
    rules,
    PREFIX,
  )


CONVERTERS = {MLM: _converter(MLM, mlm_rules), CLASSIFIER: _converter(CLASSIFIER, classifier_rules)}
