"""BART (Lewis et al. 2020) from and to Hugging Face `BartForConditionalGeneration`, and the
rules it shares with Marian (`convert.marian`).

Letters: V vocabulary, D model dim, N heads, F feed-forward width, L `max_len`.

The architecture in `ModelConfig` terms: family seq2seq, post-LN LayerNorm (eps 1e-5, no
final norm), biases everywhere, one token table shared by the encoder, the decoder and
the logits (`tie_word_embeddings`; HF >= 5 with it false unties all three tables, which
one shared table cannot express), `final_logits_bias` (HF's buffer [1, V] added to the
logits), `scale_embeddings` from `scale_embedding` (x sqrt(D) on the token embeddings
only; BART's default False), exact GELU (`activation_function`). BART adds learned
positions in each stack (`embed_positions` [L + 2, D]: HF reads row p + 2 at position p,
rows 0 and 1 are never read; ours are rows 2.., export writes two zero rows first) and a
LayerNorm after the embeddings of each stack (`layernorm_embedding` -> `embed_norm`).

Token ids. Our models, data pipelines and decoding take id 0 for padding (`segment_ids =
tokens != 0`, PAD-filled rows, masks of the sources). BART's PAD is 1 (BOS 0, EOS 2) and
Marian's is V - 1 (EOS 0), so import swaps the checkpoint's PAD row with row 0 in the
token table and `final_logits_bias`: our id 0 is HF's PAD and our id
PAD is HF's id 0 (BART's BOS, Marian's EOS); every other id is unchanged. The logits are
HF's with columns 0 and PAD swapped, and the directory's tokenizer applies the same swap
(`Converter.swapped_pad`, read by `convert.tokenizers.from_pretrained_dir`), so ids from
it are our ids. The decoder's start token is `decoder_start_id`, HF's
`decoder_start_token_id` in our ids (BART: EOS, 2; Marian: PAD, 0), used by `shift_right`
in training and by decoding. Export swaps back and writes the family's standard ids
(BART: PAD 1, BOS 0, EOS 2; Marian: PAD V - 1, EOS 0); a checkpoint with another PAD is
refused, since the swap is fixed by the config.

Not carried (training only): `activation_dropout` (our feed-forward dropout is
`dropout_rate`), `encoder_layerdrop` / `decoder_layerdrop`. Refused in one line:
different encoder and decoder heads or feed-forward widths (one `num_heads`, one `d_ff`),
`tie_word_embeddings=False`,
an unsupported `activation_function`, and the legacy keys of older config.json files set
to what the model class does not compute (`normalize_before`, `add_final_layer_norm`,
`normalize_embedding`, `static_position_embeddings`, `add_bias_logits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import t5
from transformer.convert.base import (
  HF_ACTIVATIONS,
  OUR_ACTIVATIONS,
  PLAIN,
  Converter,
  Rule,
  attention,
  linear,
  norm,
  require,
  unsupported,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "BartForConditionalGeneration"
PAD, BOS, EOS = 1, 0, 2  # BART's ids; its decoder starts from EOS
OFFSET = 2  # HF's position p reads row p + 2 of `embed_positions`
# HF `activation_function` -> ours (`swish` is SiLU, Marian's) and back.
ACTIVATIONS = {**HF_ACTIVATIONS, "swish": "silu", "silu": "silu"}
TO_HF_ACTIVATIONS = {**OUR_ACTIVATIONS, "silu": "swish"}
# Keys of older config.json files that the model class ignores, with the one value each
# that matches what it computes (BART: post-LN, the embedding norm, learned positions).
LEGACY = {
  "normalize_before": (False,),
  "add_final_layer_norm": (False,),
  "normalize_embedding": (True,),
  "static_position_embeddings": (False,),
  "add_bias_logits": (False,),
}
# Our stack names -> HF's, and the sub-layers of each layer: ours, HF's attention, HF's norm.
STACKS = {"encoder": "model.encoder", "decoder": "model.decoder"}
SUBLAYERS = {
  "encoder": (("self_attention", "self_attn", "self_attn_layer_norm"),),
  "decoder": (
    ("self_attention", "self_attn", "self_attn_layer_norm"),
    ("cross_attention", "encoder_attn", "encoder_attn_layer_norm"),
  ),
}


def swap(ids: np.ndarray | int, pad: int) -> np.ndarray | int:
  """HF ids <-> ours: `pad` and 0 trade places, every other id stays (its own inverse)."""
  out = np.where(ids == pad, 0, np.where(ids == 0, pad, ids))
  return int(out) if np.ndim(out) == 0 else out


def _rows(pad: int):
  """A table's rows (axis 0) in the other id order: [V, ...] -> [V, ...]."""

  def permute(x: np.ndarray) -> np.ndarray:
    return x[swap(np.arange(x.shape[0]), pad)]

  return permute


def model_from_hf(
  hf: Mapping[str, Any], architecture: str, pad: int, start: int, legacy: Mapping[str, tuple]
) -> dict[str, Any]:
  """The ModelConfig fields BART and Marian share, from config.json (`pad`: the PAD id
  the family's rules swap with 0; `start`: HF's default `decoder_start_token_id`)."""
  a = architecture
  require(hf, a, "is_encoder_decoder", (True,))
  require(hf, a, "tie_word_embeddings", (True,))  # False: three separate tables in HF >= 5
  for key, supported in legacy.items():
    require(hf, a, key, supported)
  if hf.get("pad_token_id", pad) != pad:
    unsupported(a, "pad_token_id", hf.get("pad_token_id"), (pad,))
  act = require(hf, a, "activation_function", tuple(ACTIVATIONS))
  heads, ffn = hf["encoder_attention_heads"], hf["encoder_ffn_dim"]
  for key, value in (("decoder_attention_heads", heads), ("decoder_ffn_dim", ffn)):
    if hf.get(key, value) != value:
      raise ValueError(
        f"{a}: {key}={hf[key]!r} is not supported (supported: {value}, the encoder's)"
      )
  start = hf.get("decoder_start_token_id", start)
  if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < hf["vocab_size"]:
    unsupported(a, "decoder_start_token_id", start, ("a token id",))
  layers, decoder_layers = hf["encoder_layers"], hf["decoder_layers"]
  return {
    "family": "seq2seq",
    "vocab_size": hf["vocab_size"],
    "d_model": hf["d_model"],
    "num_heads": heads,
    "num_kv_heads": None,
    "num_layers": layers,
    "num_decoder_layers": None if decoder_layers == layers else decoder_layers,
    "d_ff": ffn,
    "max_len": hf["max_position_embeddings"],
    "norm": "layernorm",
    "norm_position": "post",
    "norm_eps": 1e-5,  # torch.nn.LayerNorm's default, which both families use
    "activation": ACTIVATIONS[act],
    "use_bias": True,
    "type_vocab_size": 0,
    "dropout_rate": hf.get("dropout", 0.1),
    "attention_dropout_rate": hf.get("attention_dropout", 0.0),
    **PLAIN,
    "scale_embeddings": bool(hf.get("scale_embedding", False)),
    "tie_embeddings": True,
    "final_logits_bias": True,
    "decoder_start_id": swap(start, pad),
  }


def model_to_hf(c: ModelConfig, architecture: str, pad: int) -> dict[str, Any]:
  """The config.json keys BART and Marian share."""
  if c.activation not in TO_HF_ACTIVATIONS:
    unsupported(architecture, "ModelConfig.activation", c.activation, TO_HF_ACTIVATIONS)
  return {
    "vocab_size": c.vocab_size,
    "d_model": c.d_model,
    "encoder_layers": c.num_layers,
    "decoder_layers": c.decoder_layers,
    "encoder_attention_heads": c.num_heads,
    "decoder_attention_heads": c.num_heads,
    "encoder_ffn_dim": c.d_ff,
    "decoder_ffn_dim": c.d_ff,
    "max_position_embeddings": c.max_len,
    "activation_function": TO_HF_ACTIVATIONS[c.activation],
    "dropout": c.dropout_rate,
    "attention_dropout": c.attention_dropout_rate,
    "activation_dropout": 0.0,
    "scale_embedding": c.scale_embeddings,
    "tie_word_embeddings": True,
    "is_encoder_decoder": True,
    "pad_token_id": pad,
    "decoder_start_token_id": swap(c.decoder_start_id, pad),
  }


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = model_from_hf(hf, ARCHITECTURE, PAD, EOS, LEGACY)
  return {**fields, "position": "learned", "embed_norm": True}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {
    "model_type": "bart",
    **model_to_hf(c, ARCHITECTURE, PAD),
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "forced_eos_token_id": EOS,
  }


def _positions(ours: str, hf: str) -> Rule:
  """HF's [L + 2, D] table <-> ours [L, D]: its rows from 2 on (export: two zero rows)."""

  def to_hf(table):
    return (np.concatenate([np.zeros((OFFSET, table.shape[1]), table.dtype), table]),)

  return Rule((ours,), (hf,), lambda t: (t[OFFSET:],), to_hf)


def seq2seq_rules(c: ModelConfig, pad: int) -> list[Rule]:
  """The tensors of a BART or Marian model whose PAD id `pad` becomes our 0."""
  rows = _rows(pad)
  table = Rule(  # [V, D], rows swapped
    ("shared_embed/embedding",),
    ("model.shared.weight",),
    lambda w: (rows(w),),
    lambda e: (rows(e),),
  )
  bias = Rule(
    ("final_logits_bias",),
    ("final_logits_bias",),
    lambda b: (rows(b[0]),),  # [1, V] -> [V]
    lambda b: (rows(b)[None],),
  )
  out = [table, bias]
  n, h = c.num_heads, c.head_dim
  for stack, hf_stack in STACKS.items():
    if c.position == "learned":
      table = f"{hf_stack}.embed_positions.weight"
      out.append(_positions(f"{stack}_embedder/positions/embedding", table))
    if c.embed_norm:
      out += norm(f"{stack}_embedder/embed_norm", f"{hf_stack}.layernorm_embedding")
    layers = c.num_layers if stack == "encoder" else c.decoder_layers
    for i in range(layers):
      ours, theirs = f"{stack}/layer_{i}", f"{hf_stack}.layers.{i}"
      for sub, hf_attention, hf_norm in SUBLAYERS[stack]:
        projections = tuple(f"{theirs}.{hf_attention}.{x}_proj" for x in ("q", "k", "v", "out"))
        out += attention(f"{ours}/{sub}", projections, n, h)
        out += norm(f"{ours}/{sub}_norm", f"{theirs}.{hf_norm}")
      out += linear(f"{ours}/ffn/wi", f"{theirs}.fc1")
      out += linear(f"{ours}/ffn/wo", f"{theirs}.fc2")
      out += norm(f"{ours}/ffn_norm", f"{theirs}.final_layer_norm")
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE,
    "bart",
    config_from_hf,
    config_to_hf,
    lambda c: seq2seq_rules(c, PAD),
    init_inputs=t5.init_inputs,
    swapped_pad=lambda hf: PAD,
  )
}
