"""Marian (Junczys-Dowmunt et al. 2018; the Opus-MT models) from and to Hugging Face
`MarianMTModel`.

Marian is BART's layout (`convert.bart`: post-LN, biases, one shared token table, tied
logits, `final_logits_bias`, the same layer tensors) without an embedding norm, with
fixed sinusoidal positions and its own ids. Positions: HF's
`MarianSinusoidalPositionalEmbedding` puts the sines in the first half of each row and
the cosines in the second (`sinusoidal_layout='split'`), at the angles p / 10000^(2i/D)
of Vaswani et al.; the table is computed, not stored. Opus-MT scales the token
embeddings by sqrt(D) (`scale_embedding` -> `scale_embeddings`) and uses SiLU
(`activation_function='swish'` -> `activation='silu'`, not gated).

Ids: Marian's PAD is V - 1, EOS 0, and the decoder starts from PAD. As for BART, import
swaps PAD's rows with id 0's (our PAD is 0, our EOS is V - 1; the directory's tokenizer
swaps likewise), so `decoder_start_id` is 0. A PAD other than V - 1 is refused.

Refused in one line, besides BART's refusals: separate encoder and decoder vocabularies
(`share_encoder_decoder_embeddings=False`, `decoder_vocab_size` other than
`vocab_size`). HF's generation settings of Opus-MT checkpoints (`bad_words_ids` [[PAD]],
beam search by default) are not part of the model: decoding here does not forbid PAD.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import bart, t5
from transformer.convert.base import Converter, require, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "MarianMTModel"
EOS = 0  # Marian's EOS; its PAD is the last id, V - 1
# Legacy config.json keys of the Opus-MT conversions, at what `MarianMTModel` computes.
LEGACY = {**bart.LEGACY, "normalize_embedding": (False,), "static_position_embeddings": (True,)}


def pad_of(hf: Mapping[str, Any]) -> int:
  """Marian's PAD id: the last of the vocabulary."""
  return hf["vocab_size"] - 1


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a, pad = ARCHITECTURE, pad_of(hf)
  require(hf, a, "share_encoder_decoder_embeddings", (True,))
  if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
    unsupported(a, "decoder_vocab_size", hf["decoder_vocab_size"], (hf["vocab_size"],))
  fields = bart.model_from_hf(hf, a, pad, pad, LEGACY)
  return {**fields, "position": "sinusoidal", "sinusoidal_layout": "split", "embed_norm": False}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  pad = c.vocab_size - 1
  return {
    "model_type": "marian",
    **bart.model_to_hf(c, ARCHITECTURE, pad),
    "decoder_vocab_size": c.vocab_size,
    "share_encoder_decoder_embeddings": True,
    "eos_token_id": EOS,
    "forced_eos_token_id": EOS,
  }


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE,
    "marian",
    config_from_hf,
    config_to_hf,
    lambda c: bart.seq2seq_rules(c, c.vocab_size - 1),
    init_inputs=t5.init_inputs,
    swapped_pad=pad_of,
  )
}
