"""Analytic parameter counts and matmul FLOPs of the model a `ModelConfig` builds.

The parts every family shares are here; each family (`nn/models/`) adds its own
embeddings and heads, and `models.param_count` / `models.flops_per_token` sum them for a
config. tests/test_param_count.py checks the counts against real models.
"""

from __future__ import annotations

from transformer.nn.config import ModelConfig
from transformer.nn.positions import position_for

_NORM_PARAMS_PER_FEATURE = {"layernorm": 2, "rmsnorm": 1}  # scale and bias | scale


def norm_params(c: ModelConfig) -> int:
  if c.norm == "layernorm" and not c.norm_bias:
    return c.d_model  # scale only
  return _NORM_PARAMS_PER_FEATURE[c.norm] * c.d_model


def attention_params(c: ModelConfig, is_cross: bool = False) -> int:
  """Projections (+ biases, + QK-norm scales) of one attention layer, + its position
  parameters (self-attention only)."""
  if c.mla_kv_rank and not is_cross:
    return _latent_attention_params(c)
  q_out, kv_out = c.num_heads * c.head_dim, c.kv_heads * c.head_dim
  weights = c.d_model * q_out + 2 * c.d_model * kv_out + q_out * c.d_model
  biases = (q_out + 2 * kv_out if c.qkv_biases else 0) + (c.d_model if c.use_bias else 0)
  qk_norm = 0  # the query and key norms' scales: [H] each, or [N*H] and [K*H] ([N, H], [K, H])
  if c.qk_norm:
    qk_norm = 2 * c.head_dim if c.qk_norm_over == "head" else q_out + kv_out
  # Position parameters exist in self-attention only (cross-attention has no positions).
  return weights + biases + qk_norm + (0 if is_cross else position_for(c).attention_params())


def _latent_attention_params(c: ModelConfig) -> int:
  """`mla.LatentAttention`: the query projection (low-rank: down [D, Q] (+ bias), its norm
  [Q], up [Q, N, H + R]), kv_down [D, C + R] (+ bias), its norm [C], key_up [C, N, H],
  value_up [C, N, V], out [N, V, D] (+ bias)."""
  d, n, h, r, rank, q = (
    c.d_model,
    c.num_heads,
    c.head_dim,
    c.mla_rope_dim,
    c.mla_kv_rank,
    c.mla_q_rank,
  )
  bias = int(c.use_bias)
  query = d * q + bias * q + q + q * n * (h + r) if q else d * n * (h + r)
  kv = d * (rank + r) + bias * (rank + r) + rank + rank * n * (h + c.mla_value_dim)
  return query + kv + n * c.mla_value_dim * d + bias * d


def ffn_params(c: ModelConfig) -> int:
  n_in = 2 if c.gated else 1
  weights = n_in * c.d_model * c.d_ff + c.d_ff * c.d_model
  biases = (n_in * c.d_ff + c.d_model) if c.use_bias else 0
  return weights + biases


def moe_params(c: ModelConfig) -> int:
  """A mixture-of-experts FFN: the router [D, E] (and its choice bias [E]), E copies of the
  FFN, the shared expert and its gate [D]."""
  shared = ffn_params(c.replace(d_ff=c.moe_shared_d_ff)) if c.moe_shared_d_ff else 0
  gate = c.d_model if c.moe_shared_gate else 0
  bias = c.moe_experts if c.moe_selection_bias else 0  # DeepSeek-V3's choice bias [E]
  experts = c.moe_experts * ffn_params(c.replace(d_ff=c.expert_d_ff))
  return c.d_model * c.moe_experts + experts + shared + gate + bias


def stack_params(c: ModelConfig, layers: int, cross: bool) -> int:
  """A `Stack`: its layers (dense or mixture-of-experts FFN; layer 0 without its attention
  norm if `first_layer_attention_norm` is False), the final norm (pre-LN and sandwich), the
  layer scales [D] per sublayer (`layer_scale_init`) and its shared position table."""
  attention = attention_params(c) + (attention_params(c, is_cross=True) if cross else 0)
  norms_per_sublayer = 2 if c.norm_position == "sandwich" else 1
  per_layer = (2 + cross) * norms_per_sublayer * norm_params(c) + attention
  per_layer += (2 + cross) * c.d_model if c.layer_scale_init is not None else 0
  moe_layers = sum(c.is_moe_layer(i) for i in range(layers))
  body = layers * per_layer + moe_layers * moe_params(c) + (layers - moe_layers) * ffn_params(c)
  final_norm = norm_params(c) if c.norm_position != "post" else 0
  first_norm = 0 if c.first_layer_attention_norm or not layers else norm_params(c)  # layer 0's
  return body - first_norm + final_norm + position_for(c).stack_params()


def embedder_params(c: ModelConfig) -> int:
  """The position parameters of one `Embedder` (its token table is counted by the family)."""
  return position_for(c).embedding_params()


def attended_keys(seq_len: int, causal: bool, window: int | None) -> float:
  """Keys a query attends to on average, for the score and value products' FLOPs: the
  unmasked (query, key) pairs of a T x T mask over T, a causal mask's diagonal counted half
  so that causal attention is half of full (MaxText's convention, PR #1988). Full: T; a
  window |t - s| < W: 2W - 1 - W(W - 1) / T; causal: T / 2; a causal window 0 <= t - s < W:
  W - 1/2 - W(W - 1) / (2T) (a window of T or more is no window)."""
  t = float(seq_len)
  w = float(window) if window is not None and window < seq_len else None
  if causal:
    return t / 2 if w is None else w - 0.5 - w * (w - 1) / (2 * t)
  return t if w is None else 2 * w - 1 - w * (w - 1) / t


def layer_flops(
  c: ModelConfig, seq_len: int, cross: bool = False, moe: bool = False, causal: bool = False
) -> float:
  """Forward matmul FLOPs per token of one block (self-attention, + cross, + FFN).

  The score and value products count the keys each query attends to (`attended_keys`:
  causal masking halves them, a window keeps its band; `c.sliding_window` is the layer's,
  from `layer_config`); cross-attention attends to all of a source as long as the target.
  `moe`: the FFN is a mixture of experts; its active FLOPs are the router's and those of
  the K experts a token is sent to (capacity slots left empty are not counted)."""
  d, qh = c.d_model, c.num_heads * c.head_dim
  attn_proj = 2 * (d * qh + 2 * d * c.kv_heads * c.head_dim + qh * d)
  per_unit = 2 * ((2 if c.gated else 1) * d + d)  # per hidden unit of a feed-forward
  ffn = per_unit * c.d_ff
  if moe:  # the router, K experts, the shared expert (as wide as it is) and its gate
    shared = per_unit * c.moe_shared_d_ff + (2 * d if c.moe_shared_gate else 0)
    ffn = 2 * d * c.moe_experts + c.moe_top_k * per_unit * c.expert_d_ff + shared
  scores = 4 * attended_keys(seq_len, causal, c.sliding_window) * qh
  if c.mla_kv_rank:  # latent attention: its projections, keys and values expanded per token
    n, h, r, rank, q, v = (
      c.num_heads,
      c.head_dim,
      c.mla_rope_dim,
      c.mla_kv_rank,
      c.mla_q_rank,
      c.mla_value_dim,
    )
    query = 2 * (d * q + q * n * (h + r)) if q else 2 * d * n * (h + r)
    attn_proj = query + 2 * d * (rank + r) + 2 * rank * n * (h + v) + 2 * n * v * d
    scores = 2 * attended_keys(seq_len, causal, c.sliding_window) * n * (h + r + v)
  cross_scores = 4 * seq_len * qh
  return attn_proj + ffn + scores + ((attn_proj + cross_scores) if cross else 0)


def stack_flops(
  c: ModelConfig, layers: int, seq_len: int, cross: bool = False, causal: bool = False
) -> float:
  """Forward matmul FLOPs per token of a `Stack` of `layers` blocks (MoE layers' active;
  each layer's window as its `layer_config` has it)."""
  return sum(
    layer_flops(c.layer_config(i), seq_len, cross, c.is_moe_layer(i), causal) for i in range(layers)
  )
