"""An independent float64 NumPy Transformer, written from the papers, for equivalence tests.

Nothing here imports `transformer`: every function is a direct transcription of a
definition (Vaswani et al. 2017; Ba et al. 2016; Zhang & Sennrich 2019; Shazeer 2020;
Su et al. 2021; Press et al. 2022; Raffel et al. 2020; Shaw et al. 2018; Devlin et al.
2019; Dosovitskiy et al. 2021). Weights are read from a flax params pytree (converted
with `to_numpy`), so only the parameter *names and layouts* are shared with the model:

  Dense kernel [in, out]; attention query/key/value kernel [D, heads, H], bias [heads, H];
  attention out kernel [N, H, D]; norm 'scale' (and LayerNorm 'bias'); embedding tables
  'embedding' [rows, D]; ViT patch kernel [P, P, C, D].

Masks are boolean, True = may attend. A query row with no visible key gets uniform
weights (the documented behaviour of the model's attention).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Params = Mapping[str, Any]


def to_numpy(tree: Any) -> Any:
  """A (nested dict) params pytree as float64 NumPy arrays."""
  if isinstance(tree, Mapping):
    return {k: to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float64)


# ----------------------------------------------------------------------------------------
# Elementwise functions, norms, dense layers.


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
  """Exact GELU, x * Phi(x) (Hendrycks & Gimpel 2016)."""
  return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
  """GELU's tanh approximation (Hendrycks & Gimpel 2016; GPT-2, Gemma's GeGLU)."""
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
  return x / (1.0 + np.exp(-x))


def relu(x: np.ndarray) -> np.ndarray:
  return np.maximum(x, 0.0)


def softmax(logits: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """Softmax over the last axis; masked entries get weight 0, all-masked rows are uniform."""
  if mask is not None:
    mask = np.broadcast_to(mask, logits.shape)
    empty = ~mask.any(-1, keepdims=True)
    mask = mask | empty  # a row that sees nothing sees everything, equally
    logits = np.where(empty, 0.0, logits)
    logits = np.where(mask, logits, -np.inf)
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def layer_norm(x: np.ndarray, p: Params, eps: float) -> np.ndarray:
  """Ba et al. 2016: (x - mean) / sqrt(var + eps) * scale + bias over the last axis."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p.get("bias", 0.0)  # no bias: ModernBERT


def rms_norm(x: np.ndarray, p: Params, eps: float, plus_one: bool = False) -> np.ndarray:
  """Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * scale; Gemma: * (1 + scale)."""
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * (plus_one + p["scale"])


def norm(x: np.ndarray, p: Params, config) -> np.ndarray:
  if config.norm == "layernorm":
    return layer_norm(x, p, config.norm_eps)
  return rms_norm(x, p, config.norm_eps, config.norm_scale_plus_one)


def dense(x: np.ndarray, p: Params) -> np.ndarray:
  """x @ kernel (+ bias), contracting the last axis of x with the first of the kernel."""
  y = np.tensordot(x, p["kernel"], axes=([-1], [0]))
  return y + p["bias"] if "bias" in p else y


def feed_forward(x: np.ndarray, p: Params, activation: str) -> np.ndarray:
  """FFN(x) = W2 act(W1 x) (Vaswani et al. 3.3); GLU variants W2 (act(W x) * V x) (Shazeer)."""
  if activation == "relu":
    h = relu(dense(x, p["wi"]))
  elif activation == "gelu":
    h = gelu(dense(x, p["wi"]))
  elif activation == "silu":  # Marian's swish, ungated
    h = silu(dense(x, p["wi"]))
  elif activation == "swiglu":
    h = silu(dense(x, p["wi_0"])) * dense(x, p["wi_1"])
  elif activation == "geglu":
    h = gelu(dense(x, p["wi_0"])) * dense(x, p["wi_1"])
  elif activation == "geglu_tanh":
    h = gelu_tanh(dense(x, p["wi_0"])) * dense(x, p["wi_1"])
  else:
    raise ValueError(activation)
  return dense(h, p["wo"])


# ----------------------------------------------------------------------------------------
# Positions.


def sinusoidal(positions: np.ndarray, d_model: int, split: bool = False) -> np.ndarray:
  """Vaswani et al. 3.5, element by element: PE(pos, 2i) = sin(pos / 10000^(2i/d)), cos odd.
  `split` (Marian): the sine of angle i at feature i, its cosine at d/2 + i."""
  positions = np.asarray(positions)
  out = np.zeros(positions.shape + (d_model,))
  for idx in np.ndindex(positions.shape):
    pos = float(positions[idx])
    for i in range(d_model // 2):
      angle = pos / 10000.0 ** (2 * i / d_model)
      sin_at, cos_at = (i, d_model // 2 + i) if split else (2 * i, 2 * i + 1)
      out[idx + (sin_at,)] = math.sin(angle)
      out[idx + (cos_at,)] = math.cos(angle)
  return out


def sincos_2d(grid: int, d_model: int) -> np.ndarray:
  """2-D sin-cos (MAE): first half of the features encode the patch row, second the column."""
  rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
  half = d_model // 2
  return np.concatenate(
    [sinusoidal(rows.reshape(-1), half), sinusoidal(cols.reshape(-1), half)], axis=-1
  )


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
  """Su et al. 2021 as a complex rotation of the pairs (x[i], x[i + H/2]) by pos * theta^(-2i/H).

  x: [B, T, N, H]; positions: [B, T].
  """
  h = x.shape[-1]
  freq = theta ** (-2.0 * np.arange(h // 2) / h)  # [H/2]
  z = x[..., : h // 2] + 1j * x[..., h // 2 :]  # [B, T, N, H/2]
  z = z * np.exp(1j * positions[:, :, None, None] * freq)
  return np.concatenate([z.real, z.imag], axis=-1)


def alibi_slopes(n: int) -> np.ndarray:
  """Press et al. 2022 (reference code `get_slopes`): 2^(-8/n) ratio for a power of two n."""

  def power_of_2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(n).is_integer():
    return np.array(power_of_2(n))
  closest = 2 ** math.floor(math.log2(n))
  return np.array(power_of_2(closest) + list(alibi_slopes(2 * closest))[0::2][: n - closest])


def t5_relative_position_bucket(
  relative_position: int, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> int:
  """T5's `_relative_position_bucket` (Raffel et al. 2020; mesh_tensorflow), one scalar at a time.

  relative_position = memory (key) position - query position. The float32 logarithm of the
  original is kept, so the bucket edges fall exactly where T5 puts them.
  """
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += int(n < 0) * num_buckets
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return ret + n
  log = np.log(np.float32(n) / np.float32(max_exact))  # float32, as tf.log(tf.to_float(n) / ..)
  val = max_exact + int(
    np.float32(
      log / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact)
    )
  )
  return ret + min(val, num_buckets - 1)


def reference_mask(
  q_index: np.ndarray,
  kv_index: np.ndarray,
  causal: bool = False,
  window: int | None = None,
  q_segments: np.ndarray | None = None,
  kv_segments: np.ndarray | None = None,
) -> np.ndarray:
  """bool [B|1, 1, T, S]: key s visible from query t (indices, not positions)."""
  t, s = q_index[:, None], kv_index[None, :]
  allowed = np.ones((len(q_index), len(kv_index)), bool)
  if causal:
    allowed &= s <= t
  if window is not None:
    allowed &= (t - s < window) if causal else (np.abs(t - s) < window)
  allowed = allowed[None, None]
  if q_segments is not None:
    same = q_segments[:, :, None] == kv_segments[:, None, :]  # [B, T, S]
    allowed = allowed & same[:, None]
  return allowed


def prefix_lm_mask(prefix: np.ndarray, segments: np.ndarray) -> np.ndarray:
  """bool [B, 1, T, T], element by element: key s is visible from query t iff they share a
  segment and (s <= t or both are prefix tokens) (Raffel et al. 2020, 3.2.1, prefix LM)."""
  b, t = prefix.shape
  mask = np.zeros((b, 1, t, t), bool)
  for row in range(b):
    for q in range(t):
      for k in range(t):
        same = segments[row, q] == segments[row, k]
        both_prefix = bool(prefix[row, q]) and bool(prefix[row, k])
        mask[row, 0, q, k] = same and (k <= q or both_prefix)
  return mask


# ----------------------------------------------------------------------------------------
# Attention.


def attention(
  q: np.ndarray,
  k: np.ndarray,
  v: np.ndarray,
  mask: np.ndarray | None = None,
  bias: np.ndarray | None = None,
  return_weights: bool = False,
  scale: float | None = None,
  softcap: float | None = None,
):
  """softmax(cap(q k^T * scale + bias)) v per head (Vaswani et al. 3.2.1; scale 1 / sqrt(H)
  unless given; cap(s) = softcap * tanh(s / softcap), Gemma 2, when given).

  q: [B, T, N, H]; k, v: [B, S, K, H]. Query head n reads key/value head n // (N / K)
  (Ainslie et al. 2023, GQA: contiguous groups).
  """
  n, kv = q.shape[2], k.shape[2]
  k = np.repeat(k, n // kv, axis=2)  # [B, S, N, H]
  v = np.repeat(v, n // kv, axis=2)
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
  if bias is not None:
    logits = logits + bias
  if softcap is not None:
    logits = softcap * np.tanh(logits / softcap)
  weights = softmax(logits, mask)
  out = np.einsum("bnts,bsnh->btnh", weights, v)
  return (out, weights) if return_weights else out


def multi_head_attention(
  p: Params,
  x: np.ndarray,
  kv_input: np.ndarray | None,
  config,
  mask: np.ndarray | None,
  q_positions: np.ndarray,
  kv_positions: np.ndarray,
  causal: bool,
  rel_table: np.ndarray | None = None,
  is_cross: bool = False,
) -> np.ndarray:
  """MultiHead(Q, K, V) = Concat(head_1..N) W^O with the configured in-attention positions."""
  kv_input = x if kv_input is None else kv_input
  q = dense(x, p["query"])  # [B, T, N, H]
  k = dense(kv_input, p["key"])  # [B, S, K, H]
  v = dense(kv_input, p["value"])
  if config.qk_norm:  # QK-norm: RMSNorm of every query / key head over H, before RoPE

    def qk(x, p_norm):  # over each head's H features, or all N*H of the projection
      flat = x.reshape(*x.shape[:2], -1) if config.qk_norm_over == "projection" else x
      return rms_norm(flat, p_norm, config.norm_eps, config.norm_scale_plus_one).reshape(x.shape)

    if config.qk_norm_over == "each_head":  # StableLM 2: LayerNorm, a scale [N, H] per head
      q = layer_norm(q, p["query_head_norm"], config.norm_eps)
      k = layer_norm(k, p["key_head_norm"], config.norm_eps)
    else:
      q, k = qk(q, p["query_norm"]), qk(k, p["key_norm"])
  bias = None
  pos = None if is_cross else config.position
  relative = kv_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]: key - query
  if pos == "rope":  # the first rope_dim features of each head (partial rotary)
    r = int(q.shape[-1] * config.rope_fraction)
    q = np.concatenate([rope(q[..., :r], q_positions, config.rope_theta), q[..., r:]], -1)
    k = np.concatenate([rope(k[..., :r], kv_positions, config.rope_theta), k[..., r:]], -1)
  elif pos == "alibi":
    slopes = alibi_slopes(config.num_heads)
    bias = -slopes[None, :, None, None] * np.abs(relative)[:, None]
  elif pos == "relative_t5":
    buckets = np.vectorize(t5_relative_position_bucket)(
      relative, not causal, config.relative_num_buckets, config.relative_max_distance
    )
    bias = rel_table[buckets].transpose(0, 3, 1, 2)  # [B, N, T, S]
  elif pos == "relative_shaw":
    kmax = config.shaw_max_distance
    a = p["rel_key_embedding"][np.clip(relative, -kmax, kmax) + kmax]  # [B, T, S, H]
    bias = np.einsum("btnh,btsh->bnts", q, a) / math.sqrt(q.shape[-1])
  out = attention(q, k, v, mask, bias, False, config.attention_scale, config.attention_softcap)
  return np.einsum("btnh,nhd->btd", out, p["out"]["kernel"]) + p["out"].get("bias", 0.0)


# ----------------------------------------------------------------------------------------
# Blocks.


def block(
  p: Params,
  x: np.ndarray,
  config,
  mask: np.ndarray | None,
  positions: np.ndarray,
  causal: bool,
  rel_table: np.ndarray | None = None,
  encoded: np.ndarray | None = None,
  cross_mask: np.ndarray | None = None,
  attention_norm: bool = True,
) -> np.ndarray:
  """Pre-LN: x + f(norm(x)); post-LN (Vaswani et al.): norm(x + f(x)); dropout off.
  Layer scale (Touvron et al. 2021, CaiT): each branch's output times its vector [D].
  `attention_norm` False (pre-LN): x + attn(x), no norm before attention (ModernBERT)."""

  def scaled(y, name):  # 'ffn_norm' -> the branch's layer scale 'ffn_scale'
    y = y * config.residual_multiplier  # Granite
    return y if config.layer_scale_init is None else y * p[name.replace("_norm", "_scale")]

  def sublayer(x, name, f):
    if config.norm_position == "pre":
      bare = name == "self_attention_norm" and not attention_norm
      return x + scaled(f(x if bare else norm(x, p[name], config)), name)
    if config.norm_position == "sandwich":  # Gemma 2 / 3: a norm before and after f
      return x + scaled(norm(f(norm(x, p[name], config)), p[f"{name}_post"], config), name)
    if config.norm_position == "sublayer_post":  # OLMo 2: a norm on f's output
      return x + scaled(norm(f(x), p[name], config), name)
    return norm(x + scaled(f(x), name), p[name], config)

  def self_attn(h):
    return multi_head_attention(
      p["self_attention"], h, None, config, mask, positions, positions, causal, rel_table
    )

  if config.parallel_residual:  # GPT-NeoX: both sublayers read the block's input
    attended = scaled(self_attn(norm(x, p["self_attention_norm"], config)), "self_attention_norm")
    ffn_norm = p["self_attention_norm" if config.parallel_shared_norm else "ffn_norm"]
    fed = feed_forward(norm(x, ffn_norm, config), p["ffn"], config.activation)
    return x + attended + scaled(fed, "ffn_norm")
  x = sublayer(x, "self_attention_norm", self_attn)
  if encoded is not None:
    src_pos = np.broadcast_to(np.arange(encoded.shape[1]), encoded.shape[:2])

    def cross_attn(h):
      return multi_head_attention(
        p["cross_attention"],
        h,
        encoded,
        config,
        cross_mask,
        positions,
        src_pos,
        False,
        is_cross=True,
      )

    x = sublayer(x, "cross_attention_norm", cross_attn)
  return sublayer(x, "ffn_norm", lambda h: feed_forward(h, p["ffn"], config.activation))


def stack(
  p: Params,
  x: np.ndarray,
  config,
  num_layers: int,
  mask: np.ndarray | None,
  positions: np.ndarray,
  causal: bool,
  encoded: np.ndarray | None = None,
  cross_mask: np.ndarray | None = None,
  global_mask: np.ndarray | None = None,
) -> np.ndarray:
  """The layers, then the final norm (not post-LN). `global_mask`: the mask without the
  window, for the G layers of a `local_global_pattern`."""
  rel_table = p.get("rel_embedding")
  pattern = config.local_global_pattern
  for i in range(num_layers):
    changes, layer_mask = {}, mask
    if config.attention_scale_by_layer:  # GPT-2: layer i's scores / (i + 1)
      base = config.attention_scale or 1 / math.sqrt(config.head_dim)
      changes |= dict(attention_scale=base / (i + 1), attention_scale_by_layer=False)
    if pattern and pattern[i % len(pattern)] == "G":  # global: no window
      layer_mask = global_mask
      changes |= dict(sliding_window=None, local_global_pattern="", rope_local_theta=None)
    elif pattern and config.rope_local_theta is not None:  # local: its own RoPE base
      changes |= dict(rope_theta=config.rope_local_theta, rope_local_theta=None)
    if config.rope_pattern:  # R: RoPE, N: no position encoding (SmolLM3's NoPE layers)
      nope = config.rope_pattern[i % len(config.rope_pattern)] == "N"
      none = dict(position="none", rope_local_theta=None)
      changes |= dict(rope_pattern="") | (none if nope else {})
    layer_config = config.replace(**changes)
    x = block(
      p[f"layer_{i}"],
      x,
      layer_config,
      layer_mask,
      positions,
      causal,
      rel_table,
      encoded,
      cross_mask,
      attention_norm=i > 0 or config.first_layer_attention_norm,
    )
  if config.norm_position != "post":
    x = norm(x, p["final_norm"], config)
  return x


# ----------------------------------------------------------------------------------------
# Models.


def _embed(p_table: np.ndarray, tokens: np.ndarray, config) -> np.ndarray:
  x = p_table[tokens] * config.embedding_multiplier
  return x * math.sqrt(config.d_model) if config.scale_embeddings else x


def _add_positions(x, p_embedder, positions, config):
  if config.position == "learned":
    return x + p_embedder["positions"]["embedding"][positions]
  if config.position == "sinusoidal":
    split = config.sinusoidal_layout == "split"
    return x + sinusoidal(positions, config.d_model, split)
  return x


def _positions(tokens):
  return np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)


def decoder_lm(
  p: Params, tokens: np.ndarray, config, segment_ids=None, positions=None, prefix=None
) -> np.ndarray:
  """GPT: causal stack, logits x E^T (tied) or through lm_head. Returns [B, T, V].

  segment_ids / positions: packed sequences (positions restart in each segment).
  prefix: [B, T] prefix-LM markers (1 = prefix token; no sliding window).
  """
  positions = _positions(tokens) if positions is None else positions
  x = _add_positions(
    _embed(p["token_embed"]["embedding"], tokens, config), p.get("embedder"), positions, config
  )
  segments = np.ones_like(tokens) if segment_ids is None else segment_ids
  idx = np.arange(tokens.shape[1])
  mask = reference_mask(idx, idx, True, config.sliding_window, segments, segments)
  global_mask = reference_mask(idx, idx, True, None, segments, segments)
  if prefix is not None:
    mask = prefix_lm_mask(prefix, segments)
  x = stack(
    p["decoder"], x, config, config.num_layers, mask, positions, True, None, None, global_mask
  )
  logits = x @ p["token_embed"]["embedding"].T if config.tie_embeddings else dense(x, p["lm_head"])
  logits = logits * config.logits_multiplier
  cap = config.logits_softcap
  return logits if cap is None else cap * np.tanh(logits / cap)


def encoder(p_model: Params, tokens, config, segment_ids=None, token_type_ids=None):
  """BERT backbone: token + position (+ type) embeddings, (post-LN or `embed_norm`: a norm),
  the stack (its G layers of a `local_global_pattern` without the window)."""
  p = p_model["encoder"]
  positions = _positions(tokens)
  segments = (tokens != 0).astype(int) if segment_ids is None else segment_ids
  x = _add_positions(
    _embed(p_model["token_embed"]["embedding"], tokens, config),
    p.get("embedder"),
    positions,
    config,
  )
  if config.type_vocab_size:
    types = np.zeros_like(tokens) if token_type_ids is None else token_type_ids
    x = x + p["token_type_embed"]["embedding"][types]
  if config.norm_position == "post" or config.embed_norm:
    x = norm(x, p["embed_norm"], config)
  idx = np.arange(tokens.shape[1])
  mask = reference_mask(idx, idx, False, config.sliding_window, segments, segments)
  global_mask = reference_mask(idx, idx, False, None, segments, segments)
  n = config.num_layers
  return stack(p["layers"], x, config, n, mask, positions, False, global_mask=global_mask)


def masked_lm(p: Params, tokens, config, segment_ids=None, token_type_ids=None):
  """BERT MLM head: norm(gelu(W h + b)) E^T + output bias (ModernBERT: b, the output bias
  optional). Returns [B, T, V]."""
  x = encoder(p, tokens, config, segment_ids, token_type_ids)
  x = norm(gelu(dense(x, p["mlm_transform"])), p["mlm_norm"], config)
  if config.tie_embeddings:
    logits = x @ p["token_embed"]["embedding"].T
  else:
    logits = dense(x, p["mlm_head"])
  return logits + p["mlm_bias"] if config.mlm_output_bias else logits


def sequence_classifier(p: Params, tokens, config, segment_ids=None, token_type_ids=None):
  """BERT classifier: tanh(W pooled + b) then a linear classifier; ModernBERT's:
  norm(gelu(W pooled (+ b))) then the classifier. Returns [B, C]."""
  x = encoder(p, tokens, config, segment_ids, token_type_ids)
  if config.pooling == "cls":
    pooled = x[:, 0]
  else:
    valid = ((tokens != 0) if segment_ids is None else (segment_ids > 0)).astype(float)
    pooled = np.einsum("btd,bt->bd", x, valid) / np.maximum(valid.sum(1, keepdims=True), 1)
  pooled = dense(pooled, p["pooler"])
  if config.pooler_activation == "gelu_norm":  # ModernBERT: GELU, then a norm
    return dense(norm(gelu(pooled), p["pooler_norm"], config), p["classifier"])
  return dense(np.tanh(pooled), p["classifier"])


def encoder_decoder(p: Params, inputs, targets, config) -> np.ndarray:
  """Vaswani et al.: encoder over inputs, decoder over targets shifted right (start
  `decoder_start_id`, 0 = PAD as T5). BART (Lewis et al. 2020): a norm after each stack's
  embeddings (`embed_norm`), and a [V] bias on the logits (`final_logits_bias`)."""
  table = p["shared_embed"]["embedding"]
  start = config.decoder_start_id
  src_seg = (inputs != 0).astype(int)
  tgt_seg = (targets != 0).astype(int)
  src_pos, tgt_pos = _positions(inputs), _positions(targets)
  si, ti = np.arange(inputs.shape[1]), np.arange(targets.shape[1])

  def embed(tokens, positions, name):
    x = _add_positions(_embed(table, tokens, config), p.get(name), positions, config)
    return norm(x, p[name]["embed_norm"], config) if config.embed_norm else x

  x = embed(inputs, src_pos, "encoder_embedder")
  enc_mask = reference_mask(si, si, False, config.sliding_window, src_seg, src_seg)
  encoded = stack(p["encoder"], x, config, config.num_layers, enc_mask, src_pos, False)
  # Shifted right after the start token; a new segment also starts from it (T5 packing).
  prev_seg = np.concatenate([np.zeros_like(tgt_seg[:, :1]), tgt_seg[:, :-1]], axis=1)
  dec_in = np.concatenate([np.full_like(targets[:, :1], start), targets[:, :-1]], axis=1)
  dec_in = np.where(tgt_seg == prev_seg, dec_in, start)
  y = embed(dec_in, tgt_pos, "decoder_embedder")
  self_mask = reference_mask(ti, ti, True, config.sliding_window, tgt_seg, tgt_seg)
  cross_mask = reference_mask(ti, si, False, None, tgt_seg, src_seg)
  y = stack(
    p["decoder"], y, config, config.decoder_layers, self_mask, tgt_pos, True, encoded, cross_mask
  )
  logits = y @ table.T if config.tie_embeddings else dense(y, p["lm_head"])
  logits = logits + p["final_logits_bias"] if config.final_logits_bias else logits
  return logits * config.logits_multiplier


def vision_transformer(p: Params, images: np.ndarray, config) -> np.ndarray:
  """Dosovitskiy et al. eq. 1-4: linear patch projection, [CLS], positions, stack, head.

  DeiT (Touvron et al. 2021): a distillation token after [CLS], its own head, the logits
  the mean of both heads'. DINOv2 (Oquab et al. 2023): the head reads [CLS] concatenated
  with the mean of the patch tokens (pooling 'cls_mean')."""
  b, size, _, ch = images.shape
  ps, g = config.patch_size, size // config.patch_size
  patches = images.reshape(b, g, ps, g, ps, ch).transpose(0, 1, 3, 2, 4, 5)  # [B, G, G, P, P, C]
  patches = patches.reshape(b, g * g, ps * ps * ch)  # row-major patch order
  w = p["patch_embed"]["kernel"].reshape(ps * ps * ch, config.d_model)
  x = patches @ w + p["patch_embed"]["bias"]  # [B, G*G, D]
  if config.position == "sinusoidal":
    x = x + sincos_2d(g, config.d_model)
  first = []  # the learned tokens before the patches
  if config.pooling in ("cls", "cls_mean"):
    first.append(p["cls"].reshape(1, 1, -1))
  if config.vit_distillation_token:
    first.append(p["distillation_token"].reshape(1, 1, -1))
  if first:
    x = np.concatenate([np.broadcast_to(t, (b, 1, config.d_model)) for t in first] + [x], axis=1)
  if config.position == "learned":
    x = x + p["pos_embedding"]
  positions = _positions(x[..., 0])
  idx = np.arange(x.shape[1])
  mask = reference_mask(idx, idx, False, config.sliding_window)  # all True without a window
  x = stack(p["encoder"], x, config, config.num_layers, mask, positions, False)
  if config.pooling == "cls":
    pooled = x[:, 0]
  elif config.pooling == "cls_mean":
    pooled = np.concatenate([x[:, 0], x[:, len(first) :].mean(1)], axis=-1)
  else:
    pooled = x.mean(1)
  logits = dense(pooled, p["head"])
  if config.vit_distillation_token:
    logits = (logits + dense(x[:, 1], p["distillation_head"])) / 2
  return logits
