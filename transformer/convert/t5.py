"""T5 (Raffel et al. 2020; v1.0 and v1.1) from and to Hugging Face `T5ForConditionalGeneration`.

Letters: V vocabulary, D model dim, N heads, H head dim (`d_kv`), F feed-forward width,
B relative-position buckets.

The architecture in `ModelConfig` terms: family seq2seq, relative_t5 positions (one table
per stack, HF's `relative_attention_bias` of block 0), pre-RMSNorm without bias, no
projection biases, unscaled scores (`attention_scale=1.0`), no embedding scaling. v1.0:
ReLU feed-forward, logits through the shared embedding after the decoder output is
multiplied by D**-0.5 (`scale_logits`). v1.1: gated GELU with the tanh approximation
(`geglu_tanh`, HF's `gelu_new`) and its own `lm_head` (`tie_embeddings=False`).

Whether the head is tied is read from the decoder-output scaling: HF >= 5 writes
`tie_word_embeddings: true` for every T5 (and `scale_decoder_outputs`), older versions
tie exactly when they scale. So v1.0 (tied, scaled) and v1.1 (untied, unscaled) load and
save; a tied but unscaled model is refused on save (its config.json would read untied).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert.base import (
  PLAIN,
  Converter,
  Rule,
  attention,
  linear,
  norm,
  require,
  same,
  unsupported,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "T5ForConditionalGeneration"
PAD_ID, EOS_ID, DECODER_START_ID = 0, 1, 0  # T5's ids: the decoder starts from PAD

# HF `feed_forward_proj` -> our activation. HF turns 'gated-gelu' into `gelu_new` (tanh).
FFN_TO_OURS = {
  "relu": "relu",
  "gated-gelu": "geglu_tanh",
  "gelu": "gelu",
  "gelu_new": "gelu_tanh",
  "gated-silu": "swiglu",
}
FFN_TO_HF = {ours: hf for hf, ours in FFN_TO_OURS.items()}
# Our sub-layer names in HF's `block.{i}.layer.{j}` order, and HF's attention names.
SUBLAYERS = {
  "encoder": ("self_attention", "ffn"),
  "decoder": ("self_attention", "cross_attention", "ffn"),
}
HF_ATTENTION = {"self_attention": "SelfAttention", "cross_attention": "EncDecAttention"}


def _scales_output(hf: Mapping[str, Any]) -> bool:
  """Original T5 multiplies the decoder output by D**-0.5 before the logits; v1.1 does not."""
  if "scale_decoder_outputs" in hf:  # HF >= 5
    return bool(hf["scale_decoder_outputs"])
  return hf.get("tie_word_embeddings", True) is not False  # HF < 5: scaled iff tied


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "is_encoder_decoder", (True,))
  proj = hf.get("feed_forward_proj", "relu")
  if proj not in FFN_TO_OURS:
    unsupported(a, "feed_forward_proj", proj, FFN_TO_OURS)
  d, n, h = hf["d_model"], hf["num_heads"], hf["d_kv"]
  layers = hf["num_layers"]
  decoder_layers = hf.get("num_decoder_layers") or layers
  scaled = _scales_output(hf)
  rate = hf.get("dropout_rate", 0.1)
  return {
    "family": "seq2seq",
    "vocab_size": hf["vocab_size"],
    "d_model": d,
    "num_heads": n,
    "num_kv_heads": None,
    "num_layers": layers,
    "num_decoder_layers": None if decoder_layers == layers else decoder_layers,
    "d_ff": hf["d_ff"],
    "max_len": hf.get("n_positions", 512),  # T5 has no length limit; the cache length
    "position": "relative_t5",
    "relative_num_buckets": hf.get("relative_attention_num_buckets", 32),
    "relative_max_distance": hf.get("relative_attention_max_distance", 128),
    "norm": "rmsnorm",
    "norm_position": "pre",
    "norm_eps": hf.get("layer_norm_epsilon", 1e-6),
    "activation": FFN_TO_OURS[proj],
    "use_bias": False,
    "type_vocab_size": 0,
    "dropout_rate": rate,
    "attention_dropout_rate": rate,
    **PLAIN,
    "attention_head_dim": None if n * h == d else h,
    "attention_scale": 1.0,  # T5 folds the scale into its initialisation
    "tie_embeddings": scaled,
    "scale_logits": scaled,
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  if c.activation not in FFN_TO_HF:
    unsupported(ARCHITECTURE, "ModelConfig.activation", c.activation, FFN_TO_HF)
  proj = FFN_TO_HF[c.activation]
  return {
    "model_type": "t5",
    "vocab_size": c.vocab_size,
    "d_model": c.d_model,
    "d_kv": c.head_dim,
    "d_ff": c.d_ff,
    "num_layers": c.num_layers,
    "num_decoder_layers": c.decoder_layers,
    "num_heads": c.num_heads,
    "relative_attention_num_buckets": c.relative_num_buckets,
    "relative_attention_max_distance": c.relative_max_distance,
    "dropout_rate": c.dropout_rate,
    "layer_norm_epsilon": c.norm_eps,
    "feed_forward_proj": proj,
    "tie_word_embeddings": c.tie_embeddings,
    "scale_decoder_outputs": c.scale_logits,
    "n_positions": c.max_len,
    "is_encoder_decoder": True,
    "pad_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
    "decoder_start_token_id": DECODER_START_ID,
  }


def rules(c: ModelConfig) -> list[Rule]:
  n, h = c.num_heads, c.head_dim
  ffn = ("wi_0", "wi_1", "wo") if c.gated else ("wi", "wo")
  out = [same("shared_embed/embedding", "shared.weight")]  # [V, D]
  for stack, layers in (("encoder", c.num_layers), ("decoder", c.decoder_layers)):
    for i in range(layers):
      for j, sub in enumerate(SUBLAYERS[stack]):
        ours, hf = f"{stack}/layer_{i}", f"{stack}.block.{i}.layer.{j}"
        out += norm(f"{ours}/{sub}_norm", f"{hf}.layer_norm", bias=False)
        if sub == "ffn":
          for name in ffn:
            out += linear(f"{ours}/ffn/{name}", f"{hf}.DenseReluDense.{name}", bias=False)
          continue
        projections = tuple(f"{hf}.{HF_ATTENTION[sub]}.{x}" for x in "qkvo")
        out += attention(f"{ours}/{sub}", projections, n, h, qkv_bias=False, out_bias=False)
    # The stack's relative-position table [buckets, N] lives in HF's first block.
    table = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    out.append(same(f"{stack}/rel_embedding", table))
    out += norm(f"{stack}/final_norm", f"{stack}.final_layer_norm", bias=False)
  if not c.tie_embeddings:
    out += linear("lm_head", "lm_head", bias=False)
  return out


def init_inputs(c: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
  """`EncoderDecoder.init` takes inputs [B, S] and targets [B, T]."""
  tokens = np.zeros((1, 1), np.int32)
  return tokens, tokens


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "t5", config_from_hf, config_to_hf, rules, init_inputs=init_inputs
  )
}
