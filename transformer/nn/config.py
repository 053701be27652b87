"""The model configuration: one frozen dataclass, validated on construction.

`ModelConfig` is passed whole to every module; variants are derived with
`config.replace(...)`. Named sizes from the papers live in `NAMED_SIZES`, and
`param_count` / `flops_per_token` give analytic counts used for MFU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

FAMILIES = ("encoder", "decoder", "seq2seq", "vit")
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "relative_t5", "relative_shaw", "none")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
ACTIVATIONS = ("relu", "gelu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
ATTENTION_IMPLS = ("xla", "jax", "chunked")
DTYPES = ("float32", "bfloat16", "float16")
POOLINGS = ("cls", "mean")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every architectural choice of a model. Invalid combinations raise `ValueError`.

  Sizes: D = d_model, N = num_heads, K = num_kv_heads, H = head_dim = D // N,
  F = d_ff (the hidden width actually used, gated or not; see `gated_hidden_size`).
  """

  family: str = "decoder"  # encoder | decoder | seq2seq | vit
  vocab_size: int = 256  # token vocabulary (shared by source and target in seq2seq)
  d_model: int = 128  # residual stream width D
  num_heads: int = 4  # query heads N
  num_kv_heads: int | None = None  # key/value heads K (None = N: MHA; 1: MQA; else GQA)
  num_layers: int = 2  # encoder layers, or decoder layers for decoder-only / ViT
  num_decoder_layers: int | None = None  # seq2seq decoder layers (None = num_layers)
  d_ff: int = 512  # feed-forward hidden width F
  max_len: int = 256  # longest sequence (learned positions, caches, validation)
  position: str = (
    "learned"  # sinusoidal | learned | rope | alibi | relative_t5 | relative_shaw | none
  )
  rope_theta: float = 10_000.0  # RoPE base wavelength
  relative_num_buckets: int = 32  # T5 relative-position buckets
  relative_max_distance: int = 128  # T5: distances beyond this share the last bucket
  shaw_max_distance: int = 16  # Shaw et al.: relative distances clipped to [-k, k]
  norm: str = "layernorm"  # layernorm | rmsnorm
  norm_position: str = "pre"  # pre (pre-LN, final norm) | post (post-LN, Vaswani et al.)
  norm_eps: float = 1e-5  # epsilon inside the norm
  activation: str = "gelu"  # relu | gelu | swiglu | geglu
  use_bias: bool = True  # biases in attention and feed-forward projections
  dropout_rate: float = 0.0  # dropout on embeddings and residual branches
  attention_dropout_rate: float = 0.0  # dropout on attention weights
  tie_embeddings: bool = True  # logits through the input embedding (`Embed.attend`)
  scale_embeddings: bool = False  # multiply token embeddings by sqrt(D) (Vaswani et al.)
  type_vocab_size: int = 0  # encoder segment (token type) embeddings; 0 = none
  num_classes: int = 0  # classifier classes (encoder classification, ViT)
  image_size: int = 224  # ViT input height = width in pixels
  patch_size: int = 16  # ViT square patch side in pixels
  num_channels: int = 3  # ViT input channels
  pooling: str = "cls"  # ViT / classifier pooling: cls token or mean over positions
  attention_impl: str = "xla"  # xla (einsum) | jax (jax.nn.dot_product_attention) | chunked
  attention_chunk_size: int = 512  # query/key block size of the chunked implementation
  sliding_window: int | None = None  # local attention: a query sees keys within this distance
  dtype: str = "float32"  # compute dtype; parameters stay float32
  scan_layers: bool = False  # nn.scan over layers (compile time flat in depth)
  remat_policy: str = "none"  # none | full | dots | dots_no_batch (nn.remat per layer)

  def __post_init__(self):
    _validate(self)

  def replace(self, **changes: Any) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def gated(self) -> bool:
    return self.activation in GATED_ACTIVATIONS


def _fail(field: str, value: Any, rule: str):
  raise ValueError(f"ModelConfig.{field}={value!r}: {rule}")


def _validate(c: ModelConfig) -> None:
  for field, options in (
    ("family", FAMILIES),
    ("position", POSITIONS),
    ("norm", NORMS),
    ("norm_position", NORM_POSITIONS),
    ("activation", ACTIVATIONS),
    ("attention_impl", ATTENTION_IMPLS),
    ("dtype", DTYPES),
    ("pooling", POOLINGS),
    ("remat_policy", REMAT_POLICIES),
  ):
    value = getattr(c, field)
    if value not in options:
      _fail(field, value, f"must be one of {', '.join(options)}")
  for field in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len"):
    value = getattr(c, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      _fail(field, value, "must be a positive integer")
  for field in ("num_kv_heads", "num_decoder_layers", "sliding_window"):
    value = getattr(c, field)
    if value is not None and (not isinstance(value, int) or value <= 0):
      _fail(field, value, "must be a positive integer or None")
  for field in ("type_vocab_size", "num_classes"):
    if getattr(c, field) < 0:
      _fail(field, getattr(c, field), "must be >= 0")
  for field in ("dropout_rate", "attention_dropout_rate"):
    value = getattr(c, field)
    if not 0.0 <= value < 1.0:
      _fail(field, value, "must be in [0, 1)")
  if c.norm_eps <= 0:
    _fail("norm_eps", c.norm_eps, "must be > 0")
  if c.d_model % c.num_heads:
    _fail("d_model", c.d_model, f"must be divisible by num_heads={c.num_heads}")
  if c.num_heads % c.kv_heads:
    _fail("num_kv_heads", c.num_kv_heads, f"must divide num_heads={c.num_heads}")
  if c.position == "rope" and c.head_dim % 2:
    _fail("position", c.position, f"rope needs an even head_dim, got {c.head_dim}")
  if c.position == "sinusoidal" and c.d_model % 2:
    _fail("position", c.position, f"sinusoidal needs an even d_model, got {c.d_model}")
  if c.rope_theta <= 0:
    _fail("rope_theta", c.rope_theta, "must be > 0")
  if c.attention_chunk_size <= 0:
    _fail("attention_chunk_size", c.attention_chunk_size, "must be > 0")
  if c.position == "relative_t5":
    # Buckets split per direction, then half exact: max_exact = buckets // 4 (encoder) or
    # buckets // 2 (decoder), and the log-spaced buckets need max_distance > max_exact.
    if c.relative_num_buckets < 4:
      _fail("relative_num_buckets", c.relative_num_buckets, "T5 needs at least 4 buckets")
    if c.relative_max_distance <= c.relative_num_buckets // 2:
      _fail(
        "relative_max_distance",
        c.relative_max_distance,
        f"must exceed relative_num_buckets // 2 = {c.relative_num_buckets // 2}",
      )
  if c.position == "relative_shaw" and c.shaw_max_distance < 1:
    _fail("shaw_max_distance", c.shaw_max_distance, "must be >= 1")
  if c.family == "vit":
    for field in ("image_size", "patch_size", "num_channels"):
      value = getattr(c, field)
      if not isinstance(value, int) or value <= 0:
        _fail(field, value, "must be a positive integer")
    if c.position == "sinusoidal" and c.d_model % 4:
      _fail("position", c.position, f"2-D sin-cos needs d_model divisible by 4, got {c.d_model}")
    if c.image_size % c.patch_size:
      _fail("image_size", c.image_size, f"must be divisible by patch_size={c.patch_size}")
    if c.num_classes <= 0:
      _fail("num_classes", c.num_classes, "a ViT needs num_classes > 0")
    if c.position not in ("learned", "sinusoidal", "none"):
      _fail("position", c.position, "ViT supports learned, sinusoidal (2-D sin-cos) or none")
    tokens = c.num_patches + (c.pooling == "cls")
    if tokens > c.max_len:
      _fail("max_len", c.max_len, f"must be >= {tokens} image tokens")
  if c.family == "decoder" and c.type_vocab_size:
    _fail("type_vocab_size", c.type_vocab_size, "segment embeddings are for the encoder family")


def gated_hidden_size(d_model: int, multiple_of: int = 256) -> int:
  """The 2/3 rule: a gated unit with 3 matrices matches a 4*D two-matrix FFN's parameters.

  F = 2/3 * 4 * D, rounded up to a multiple of `multiple_of` (Shazeer 2020; LLaMA).
  """
  hidden = int(2 * 4 * d_model / 3)
  return multiple_of * math.ceil(hidden / multiple_of)


# Named sizes. Each entry overrides ModelConfig defaults; the source is cited.
NAMED_SIZES: dict[str, dict[str, Any]] = {
  # Vaswani et al. 2017, Table 3 (shared 37000 BPE vocabulary, post-LN, ReLU, sinusoidal).
  "transformer_base": dict(
    family="seq2seq",
    vocab_size=37000,
    d_model=512,
    num_heads=8,
    num_layers=6,
    d_ff=2048,
    max_len=256,
    position="sinusoidal",
    norm_position="post",
    activation="relu",
    dropout_rate=0.1,
    scale_embeddings=True,
    tie_embeddings=True,
  ),
  "transformer_big": dict(
    family="seq2seq",
    vocab_size=37000,
    d_model=1024,
    num_heads=16,
    num_layers=6,
    d_ff=4096,
    max_len=256,
    position="sinusoidal",
    norm_position="post",
    activation="relu",
    dropout_rate=0.3,
    scale_embeddings=True,
    tie_embeddings=True,
  ),
  # Devlin et al. 2019, Section 3 (WordPiece 30522 vocabulary, 512 positions, 2 segments).
  "bert_base": dict(
    family="encoder",
    vocab_size=30522,
    d_model=768,
    num_heads=12,
    num_layers=12,
    d_ff=3072,
    max_len=512,
    position="learned",
    norm_position="post",
    activation="gelu",
    type_vocab_size=2,
    norm_eps=1e-12,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  ),
  "bert_large": dict(
    family="encoder",
    vocab_size=30522,
    d_model=1024,
    num_heads=16,
    num_layers=24,
    d_ff=4096,
    max_len=512,
    position="learned",
    norm_position="post",
    activation="gelu",
    type_vocab_size=2,
    norm_eps=1e-12,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  ),
  # Radford et al. 2019, Table 2 (vocabulary 50257, context 1024, tied embeddings).
  "gpt2_small": dict(
    family="decoder",
    vocab_size=50257,
    d_model=768,
    num_heads=12,
    num_layers=12,
    d_ff=3072,
    max_len=1024,
    position="learned",
    activation="gelu",
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  ),
  "gpt2_medium": dict(
    family="decoder",
    vocab_size=50257,
    d_model=1024,
    num_heads=16,
    num_layers=24,
    d_ff=4096,
    max_len=1024,
    position="learned",
    activation="gelu",
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  ),
  "gpt2_large": dict(
    family="decoder",
    vocab_size=50257,
    d_model=1280,
    num_heads=20,
    num_layers=36,
    d_ff=5120,
    max_len=1024,
    position="learned",
    activation="gelu",
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  ),
  # Dosovitskiy et al. 2021, Table 1 (B, L); Touvron et al. 2021, Table 1 (Ti, S).
  # ImageNet at 224 px, 1000 classes, [CLS] pooling, learned positions.
  **{
    f"vit_{name}/{patch}": dict(
      family="vit",
      d_model=d,
      num_heads=n,
      num_layers=l,
      d_ff=f,
      image_size=224,
      patch_size=patch,
      num_classes=1000,
      max_len=(224 // patch) ** 2 + 1,
      position="learned",
      activation="gelu",
      norm_eps=1e-6,
      pooling="cls",
    )
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


# ----------------------------------------------------------------------------------------
# Analytic parameter count and FLOPs.


def _norm_params(c: ModelConfig) -> int:
  return 2 * c.d_model if c.norm == "layernorm" else c.d_model


def _attention_params(c: ModelConfig, is_cross: bool = False) -> int:
  q_out, kv_out = c.num_heads * c.head_dim, c.kv_heads * c.head_dim
  weights = c.d_model * q_out + 2 * c.d_model * kv_out + q_out * c.d_model
  biases = (q_out + 2 * kv_out + c.d_model) if c.use_bias else 0
  # Shaw relative keys exist in self-attention only (cross-attention has no positions).
  shaw = c.position == "relative_shaw" and not is_cross
  return weights + biases + ((2 * c.shaw_max_distance + 1) * c.head_dim if shaw else 0)


def _ffn_params(c: ModelConfig) -> int:
  n_in = 2 if c.gated else 1
  weights = n_in * c.d_model * c.d_ff + c.d_ff * c.d_model
  biases = (n_in * c.d_ff + c.d_model) if c.use_bias else 0
  return weights + biases


def _stack_params(c: ModelConfig, layers: int, cross: bool) -> int:
  attention = _attention_params(c) + (_attention_params(c, is_cross=True) if cross else 0)
  per_layer = (2 + cross) * _norm_params(c) + attention + _ffn_params(c)
  final_norm = _norm_params(c) if c.norm_position == "pre" else 0
  t5_bias = c.relative_num_buckets * c.num_heads if c.position == "relative_t5" else 0
  return layers * per_layer + final_norm + t5_bias


def param_count(c: ModelConfig) -> int:
  """Exact number of parameters of the model `c` builds (see tests/test_param_count.py)."""
  d = c.d_model
  learned_pos = c.position == "learned"
  if c.family == "vit":
    tokens = c.num_patches + (c.pooling == "cls")
    patch = c.patch_size**2 * c.num_channels * d + d
    return (
      patch
      + (d if c.pooling == "cls" else 0)
      + (tokens * d if learned_pos else 0)
      + _stack_params(c, c.num_layers, cross=False)
      + d * c.num_classes
      + c.num_classes
    )
  embed = c.vocab_size * d + (c.max_len * d if learned_pos else 0)
  if c.family == "decoder":
    head = 0 if c.tie_embeddings else d * c.vocab_size
    return embed + _stack_params(c, c.num_layers, cross=False) + head
  if c.family == "seq2seq":
    # Shared source/target embeddings (Vaswani et al. 3.4); untied adds output logits.
    head = 0 if c.tie_embeddings else d * c.vocab_size
    decoder_pos = c.max_len * d if learned_pos else 0
    return (
      embed
      + decoder_pos
      + _stack_params(c, c.num_layers, cross=False)
      + _stack_params(c, c.decoder_layers, cross=True)
      + head
    )
  # encoder: MaskedLM when num_classes == 0, else SequenceClassifier.
  embed += c.type_vocab_size * d
  embed_norm = _norm_params(c) if c.norm_position == "post" else 0
  if c.num_classes:  # SequenceClassifier: pooler + classifier.
    head = d * d + d + d * c.num_classes + c.num_classes
  else:  # MaskedLM: transform, norm, output bias (+ untied output matrix).
    head = d * d + d + _norm_params(c) + c.vocab_size
    head += 0 if c.tie_embeddings else d * c.vocab_size
  return embed + embed_norm + _stack_params(c, c.num_layers, cross=False) + head


def flops_per_token(
  c: ModelConfig, seq_len: int, training: bool = True, mlm_predictions: int | None = None
) -> float:
  """Matmul FLOPs per token (2 per multiply-add), forward or forward+backward (x3).

  Counts every projection, the feed-forward, the output logits (or classifier) and the
  attention score and value products (4 * T * N * H per layer and token, the PaLM convention;
  causal masking is not subtracted). Norms, softmax and elementwise work are excluded.
  `mlm_predictions`: the encoder's MLM head runs at that many of every `seq_len` positions
  (the train step's `mlm_max_predictions`) instead of all of them.
  """
  d, qh = c.d_model, c.num_heads * c.head_dim
  attn_proj = 2 * (d * qh + 2 * d * c.kv_heads * c.head_dim + qh * d)
  ffn = 2 * ((2 if c.gated else 1) * d * c.d_ff + c.d_ff * d)
  scores = 4 * seq_len * qh
  per_layer = attn_proj + ffn + scores
  if c.family == "seq2seq":
    cross = attn_proj + scores
    body = c.num_layers * per_layer + c.decoder_layers * (per_layer + cross)
    # Tokens are counted on the target side; source and target lengths are taken equal.
    head = 2 * d * c.vocab_size
  elif c.family == "vit":
    body = c.num_layers * per_layer
    head = 2 * c.patch_size**2 * c.num_channels * d  # patch embedding per image token
  elif c.family == "encoder":
    body = c.num_layers * per_layer
    head = 2 * (d * d + d * c.vocab_size)  # MLM transform + logits
    if mlm_predictions is not None:
      head *= mlm_predictions / seq_len
  else:
    body = c.num_layers * per_layer
    head = 2 * d * c.vocab_size
  forward = body + head
  return 3.0 * forward if training else float(forward)
