"""ModernBERT (`ModernBertForMaskedLM`, `ModernBertForSequenceClassification`).

Letters: D model dim, N heads, H head dim, F feed-forward width.

A pre-LN encoder (Warner et al. 2024) with:
- token embeddings, then a LayerNorm (`embed_norm=True`), no position table; LayerNorms
  without biases unless `norm_bias` (`ModelConfig.norm_bias`);
- RoPE on every layer: `rope_parameters['full_attention']` on the global layers
  (`rope_theta`), `['sliding_attention']` on the local ones (`rope_local_theta`); 4.x
  configs' `global_rope_theta` / `local_rope_theta` read the same;
- layer i global when `layer_types[i]` is 'full_attention' (4.x:
  i % `global_attn_every_n_layers` == 0), -> `local_global_pattern` (the shortest period:
  'GLL' for every third); a local layer lets query t see key s when |t - s| <=
  `local_attention` // 2, ours when |t - s| < `sliding_window`, so `sliding_window` =
  `local_attention` // 2 + 1 (export: `local_attention` = 2 (`sliding_window` - 1));
- layer 0's attention reads the normed embeddings without a norm of its own
  (`first_layer_attention_norm=False`; HF's `attn_norm` is the identity there);
- a GLU feed-forward: `mlp.Wi` [2F, D] packs the activated half first, then the gate half,
  act(x W[:F]) * (x W[F:]) -> `wi_0`, `wi_1` (`hidden_activation` 'gelu' is exact GELU:
  `geglu`; the tanh forms `geglu_tanh`; 'silu' `swiglu`);
- fused `attn.Wqkv` [3 N H, D] (query, key, value rows in that order) and `attn.Wo`;
  biases on both and the MLP when `attention_bias` (= `mlp_bias`: one `use_bias`);
- a final norm, then the head: `head.dense` (bias only if `classifier_bias`:
  `head_bias`), exact GELU (`classifier_activation`), `head.norm`; masked LM: `decoder`
  tied to the embedding (untied if `tie_word_embeddings` is false: `mlm_head`) with its
  bias when `decoder_bias` (`mlm_output_bias`); classifier: the [CLS] token or the masked
  mean (`classifier_pooling` -> `pooling`), the head (`pooler_activation='gelu_norm'`:
  `pooler`, `pooler_norm`), dropout and `classifier`.

HF's unpadding and flash attention paths compute the same as its eager / sdpa path on
padded inputs, which is what ours reproduces (pass the attention mask as `segment_ids`).
Dropout: `embedding_dropout` -> `dropout_rate`, `attention_dropout` ->
`attention_dropout_rate` (export writes `dropout_rate` also to `mlp_dropout` and
`classifier_dropout`; HF's `attention_dropout` also drops the attention output, ours
not: training only). Export writes ModernBERT's special ids where the vocabulary holds
them, else PAD 0 and no others.

Refused in one line: `mlp_bias` different from `attention_bias`, a `rope_type` other than
'default' (or `rope_scaling`), activations other than those above (the head's other than
'gelu'), `layer_types` other than 'full_attention' / 'sliding_attention', a
`classifier_pooling` other than 'cls' / 'mean'.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  heads_out,
  labels,
  layer_pattern,
  layer_types,
  linear,
  norm,
  num_labels,
  require,
  same,
  unsupported,
)
from transformer.nn.config import ModelConfig

MLM = "ModernBertForMaskedLM"
CLASSIFIER = "ModernBertForSequenceClassification"
PREFIX = "model."
# hidden_activation -> ModelConfig.activation (the GLU of that activation) and back.
GLU = {
  "gelu": "geglu",
  "gelu_pytorch_tanh": "geglu_tanh",
  "gelu_new": "geglu_tanh",
  "silu": "swiglu",
}
HF_GLU = {"geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh", "swiglu": "silu"}
THETAS = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}  # HF's defaults
LOCAL_ATTENTION = 128  # HF's default window, written when every layer is global
# ModernBERT's tokenizer: PAD, BOS = CLS, EOS = SEP.
IDS = {"pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282}
IDS |= {"cls_token_id": 50281, "sep_token_id": 50282}


def _pattern(hf: Mapping[str, Any], a: str) -> str:
  """`local_global_pattern` of `layer_types` (4.x: of `global_attn_every_n_layers`): the
  shortest period of the layers' kinds."""
  layers = hf["num_hidden_layers"]
  types = hf.get("layer_types")
  if types is None:
    every = hf.get("global_attn_every_n_layers", 3)
    types = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
  return layer_pattern(a, types, layers)


def _thetas(hf: Mapping[str, Any], a: str) -> dict[str, float]:
  """Layer kind -> RoPE base, from `rope_parameters` (transformers 5) or 4.x's fields."""
  if hf.get("rope_scaling") is not None:
    unsupported(a, "rope_scaling", hf["rope_scaling"], (None,))
  rope = hf.get("rope_parameters") or {}
  old = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
  out = {}
  for kind, default in THETAS.items():
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      unsupported(a, f"rope_parameters[{kind!r}].rope_type", params["rope_type"], ("default",))
    out[kind] = float(params.get("rope_theta", hf.get(old[kind], default)))
  return out


def config_from_hf(architecture: str, hf: Mapping[str, Any]) -> dict[str, Any]:
  a = architecture
  bias = require(hf, a, "attention_bias", (False, True))
  require(hf, a, "mlp_bias", (bias,))
  require(hf, a, "classifier_activation", ("gelu",))
  activation = GLU[require(hf, a, "hidden_activation", tuple(GLU))]
  pattern, thetas = _pattern(hf, a), _thetas(hf, a)
  local = "L" in pattern
  fields = {
    **PLAIN,
    "family": "encoder",
    "vocab_size": hf["vocab_size"],
    "d_model": hf["hidden_size"],
    "num_heads": hf["num_attention_heads"],
    "num_kv_heads": None,
    "num_layers": hf["num_hidden_layers"],
    "d_ff": hf["intermediate_size"],
    "max_len": hf.get("max_position_embeddings", 8192),
    "type_vocab_size": 0,
    "position": "rope",
    "rope_theta": thetas["full_attention"],
    "rope_scaling": "none",
    "rope_local_theta": thetas["sliding_attention"] if local else None,
    "sliding_window": hf.get("local_attention", LOCAL_ATTENTION) // 2 + 1 if local else None,
    "local_global_pattern": pattern if local else "",
    "norm": "layernorm",
    "norm_position": "pre",
    "norm_eps": hf.get("norm_eps", 1e-5),
    "norm_bias": hf.get("norm_bias", False),
    "embed_norm": True,
    "first_layer_attention_norm": False,
    "activation": activation,
    "use_bias": bias,
    "head_bias": hf.get("classifier_bias", False),
    "dropout_rate": hf.get("embedding_dropout", 0.0),
    "attention_dropout_rate": hf.get("attention_dropout", 0.0),
  }
  if a == MLM:
    fields |= {"num_classes": 0, "tie_embeddings": hf.get("tie_word_embeddings", True)}
    return fields | {"mlm_output_bias": hf.get("decoder_bias", True)}
  pooling = require(hf, a, "classifier_pooling", ("cls", "mean"))
  return fields | {
    "num_classes": num_labels(hf),
    "pooling": pooling,
    "pooler_activation": "gelu_norm",
  }


def config_to_hf(architecture: str, c: ModelConfig) -> dict[str, Any]:
  if c.activation not in HF_GLU:
    unsupported(architecture, "ModelConfig.activation", c.activation, HF_GLU)
  types = layer_types(c)
  local = c.sliding_window is not None and "sliding_attention" in types
  out = {
    "model_type": "modernbert",
    "vocab_size": c.vocab_size,
    "hidden_size": c.d_model,
    "num_attention_heads": c.num_heads,
    "num_hidden_layers": c.num_layers,
    "intermediate_size": c.d_ff,
    "max_position_embeddings": c.max_len,
    "hidden_activation": HF_GLU[c.activation],
    "classifier_activation": "gelu",
    "layer_types": types,
    "local_attention": 2 * (c.sliding_window - 1) if local else LOCAL_ATTENTION,
    "rope_parameters": {
      "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
      "sliding_attention": {
        "rope_type": "default",
        "rope_theta": c.rope_local_theta or THETAS["sliding_attention"],
      },
    },
    "norm_eps": c.norm_eps,
    "norm_bias": c.norm_bias,
    "attention_bias": c.use_bias,
    "mlp_bias": c.use_bias,
    "classifier_bias": c.head_bias,
    "embedding_dropout": c.dropout_rate,
    "mlp_dropout": c.dropout_rate,
    "attention_dropout": c.attention_dropout_rate,
    **_ids(c),
  }
  if architecture == MLM:
    return out | {"tie_word_embeddings": c.tie_embeddings, "decoder_bias": c.mlm_output_bias}
  out |= {"classifier_pooling": c.pooling, "classifier_dropout": c.dropout_rate}
  return out | labels(c.num_classes)


def _ids(c: ModelConfig) -> dict[str, int | None]:
  """ModernBERT's special ids where the vocabulary holds them, else PAD 0 and no others."""
  if c.vocab_size > max(IDS.values()):
    return dict(IDS)
  return {name: 0 if name == "pad_token_id" else None for name in IDS}


def qkv(ours: str, hf: str, heads: int, head_dim: int, bias: bool) -> list[Rule]:
  """Fused `Wqkv` [3 N H, D] (+ [3 N H]): query, key, value rows in that order <-> our
  query, key, value kernels [D, N, H] (+ biases [N, H])."""
  names = ("query", "key", "value")

  def kernels_to_ours(w):  # [3 N H, D] -> 3 x [D, N, H]
    return tuple(part.T.reshape(w.shape[1], heads, head_dim) for part in np.split(w, 3))

  def kernels_to_hf(*kernels):  # 3 x [D, N, H] -> [3 N H, D]
    return (np.concatenate([k.reshape(k.shape[0], heads * head_dim).T for k in kernels]),)

  rules = [
    Rule(
      tuple(f"{ours}/{n}/kernel" for n in names),
      (f"{hf}.weight",),
      kernels_to_ours,
      kernels_to_hf,
    )
  ]
  if bias:
    rules.append(
      Rule(
        tuple(f"{ours}/{n}/bias" for n in names),
        (f"{hf}.bias",),
        lambda b: tuple(part.reshape(heads, head_dim) for part in np.split(b, 3)),  # [N, H]
        lambda *bs: (np.concatenate([b.reshape(heads * head_dim) for b in bs]),),  # [3 N H]
      )
    )
  return rules


def glu_in(ours: str, hf: str, bias: bool) -> list[Rule]:
  """`Wi` [2F, D] (+ [2F]): the activated half, then the gate half <-> `wi_0`, `wi_1`."""
  rules = [
    Rule(
      (f"{ours}/wi_0/kernel", f"{ours}/wi_1/kernel"),
      (f"{hf}.weight",),
      lambda w: tuple(part.T for part in np.split(w, 2)),  # 2 x [D, F]
      lambda k0, k1: (np.concatenate([k0.T, k1.T]),),  # [2F, D]
    )
  ]
  if bias:
    rules.append(
      Rule(
        (f"{ours}/wi_0/bias", f"{ours}/wi_1/bias"),
        (f"{hf}.bias",),
        lambda b: tuple(np.split(b, 2)),
        lambda b0, b1: (np.concatenate([b0, b1]),),
      )
    )
  return rules


def backbone(c: ModelConfig) -> list[Rule]:
  """Embeddings, layers and the final norm: ours 'encoder/...' <-> HF's 'model....'."""
  m, nb, heads = PREFIX, c.norm_bias, (c.num_heads, c.head_dim)
  out = [
    same("token_embed/embedding", f"{m}embeddings.tok_embeddings.weight"),
    *norm("encoder/embed_norm", f"{m}embeddings.norm", nb),
    *norm("encoder/layers/final_norm", f"{m}final_norm", nb),
  ]
  for i in range(c.num_layers):
    ours, hf = f"encoder/layers/layer_{i}", f"{m}layers.{i}"
    if i > 0:  # layer 0's attn_norm is the identity
      out += norm(f"{ours}/self_attention_norm", f"{hf}.attn_norm", nb)
    out += qkv(f"{ours}/self_attention", f"{hf}.attn.Wqkv", *heads, c.use_bias)
    out += heads_out(f"{ours}/self_attention/out", f"{hf}.attn.Wo", *heads, c.use_bias)
    out += norm(f"{ours}/ffn_norm", f"{hf}.mlp_norm", nb)
    out += glu_in(f"{ours}/ffn", f"{hf}.mlp.Wi", c.use_bias)
    out += linear(f"{ours}/ffn/wo", f"{hf}.mlp.Wo", c.use_bias)
  return out


def mlm_rules(c: ModelConfig) -> list[Rule]:
  out = backbone(c)
  out += linear("mlm_transform", "head.dense", c.head_bias)
  out += norm("mlm_norm", "head.norm", c.norm_bias)
  if not c.tie_embeddings:
    out += linear("mlm_head", "decoder", bias=False)
  return out + ([same("mlm_bias", "decoder.bias")] if c.mlm_output_bias else [])


def classifier_rules(c: ModelConfig) -> list[Rule]:
  out = backbone(c) + linear("pooler", "head.dense", c.head_bias)
  return out + norm("pooler_norm", "head.norm", c.norm_bias) + linear("classifier", "classifier")


CONVERTERS = {
  name: Converter(
    name,
    "modernbert",
    functools.partial(config_from_hf, name),
    functools.partial(config_to_hf, name),
    rules,
    PREFIX,
  )
  for name, rules in ((MLM, mlm_rules), (CLASSIFIER, classifier_rules))
}
