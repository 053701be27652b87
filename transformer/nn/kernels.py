"""Scaled dot-product attention: one function, five implementations that agree.

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
G = N // K query heads per key/value head, H head dim.

Query head n uses key/value head n // G (heads of one group are contiguous, as in
PyTorch's `enable_gqa` and `repeat_interleave`). Masks are boolean, True = may attend,
broadcastable to [B, N, T, S]:

  'xla'      einsum + float32 softmax; the reference, supports everything (also the
             score soft-cap of `options.softcap`, as 'chunked' does). With the
             'fast' ops, causal self-attention runs by query blocks (`ops.causal_blocks`).
  'jax'      `jax.nn.dot_product_attention` with its default (XLA) implementation; falls
             back to 'xla' when attention dropout is active or weights are requested.
  'chunked'  online softmax over [chunk x chunk] blocks (Rabe & Staats 2021; the
             FlashAttention recurrence); memory grows linearly with length when the mask
             comes from a `MaskInfo` and the bias from a `BlockBias` (both built per
             block: no dense [T, S] mask or bias).
  'cudnn'    cuDNN flash attention on NVIDIA GPUs (`_cudnn_attention`): causal and its
             window as the API's own arguments, segment ids / prefix / bidirectional
             window as a dense mask; bfloat16 or float16, head dim a multiple of 8 and
             <= 256 (128 before Hopper), any logit bias (in the compute dtype).
  'splash'   the Pallas splash kernel on TPUs (`splash.py`): causal, windows, segment ids,
             MHA / GQA / MQA, sharded per device under a mesh; no logit bias.

Under a mesh whose 'context' axis splits the sequence, every call (but one returning the
weights) is context-parallel instead: 'splash' with the all-gather strategy runs the
kernel on each device's queries over the gathered K/V (`splash.sequence_sharded_attention`);
otherwise `context.attention` does all-gather or ring attention over the pieces
(`options.context`), each device's blocks computed as 'xla' computes them.

A config's 'auto' never reaches this module: `kernel_rules.attention_options` resolves it
once per config, to the backend's best kernel that the config allows.

Neither fused kernel has attention dropout (refused in one line, as is a missing GPU or
TPU, or an input the kernel rejects). Both use 'xla' where they cannot apply: weights
requested (`return_weights`), cached decoding (a query offset known only at run time),
and for splash also a dense `mask` or a prefix-LM mask. A query row that sees no key
(cross-attention with padding) gets uniform weights over the keys its blocks visit in the
fused kernels, over all S in the others.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn import context, partitioning, splash
from transformer.nn.kernel_rules import AttentionOptions, call_impl
from transformer.nn.masks import MASK_VALUE, BlockBias, MaskInfo, combine_masks
from transformer.ops import select
from transformer.ops.causal_blocks import causal_block_attention, slice_broadcast


def dot_product_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask_info: MaskInfo | None = None,
  options: AttentionOptions = AttentionOptions(),
  *,
  mask: jax.Array | None = None,
  bias: jax.Array | BlockBias | None = None,
  dropout_rng: jax.Array | None = None,
  deterministic: bool = True,
  return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """softmax(scale * q k^T + bias, masked) v, scale = 1 / sqrt(H) unless options.scale.

  Args:
    q: [B, T, N, H]; k, v: [B, S, K, H] with N % K == 0.
    mask_info: optional factored mask; the chunked path builds it block by block.
    options: the kernel and its settings (`kernel_rules.AttentionOptions`; the module
      docstring says what each kernel supports and where it uses 'xla' instead).
    mask: optional bool, broadcastable to [B, N, T, S], True = attend (AND-ed with
      `mask_info`).
    bias: optional float additive bias broadcastable to [B, N, T, S], or a `BlockBias`
      (position biases) that the chunked path builds block by block at the `mask_info`
      positions and the others build whole.
    dropout_rng, deterministic: dropout at `options.dropout_rate` on the attention
      weights, unless deterministic.
    return_weights: also return the weights [B, N, T, S] (computed by 'xla').
  Returns:
    [B, T, N, H] in q's dtype (and the float32 weights if asked).
  """
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
  use_dropout = options.dropout_rate > 0.0 and not deterministic
  if use_dropout and dropout_rng is None:
    raise ValueError("attention dropout needs a dropout_rng")
  kernels = select(options.ops)
  rate = options.dropout_rate if use_dropout else 0.0
  scale = q.shape[-1] ** -0.5 if options.scale is None else options.scale
  impl = call_impl(options.impl, q, k, mask, mask_info, bias, use_dropout, return_weights)
  context_ways = partitioning.context_size()
  if context_ways > 1 and not return_weights:
    if use_dropout or mask is not None:
      what = "attention dropout" if use_dropout else "a dense mask"
      raise ValueError(f"context parallelism (mesh.context > 1) takes no {what}")
    if impl == "splash" and options.context == "all_gather":
      block_q, block_kv = options.splash_blocks
      return splash.sequence_sharded_attention(
        q, k, v, mask_info, scale=scale, block_q=block_q, block_kv=block_kv, context=context_ways
      )
    return context.attention(
      q, k, v, mask_info, bias, strategy=options.context, scale=scale, softcap=options.softcap
    )
  if impl == "splash":
    block_q, block_kv = options.splash_blocks
    return splash.splash_attention(
      q, k, v, mask_info, scale=scale, block_q=block_q, block_kv=block_kv
    )
  if isinstance(bias, BlockBias) and (impl != "chunked" or return_weights):
    bias = bias.dense(q, mask_info)  # [B|1, N, T, S] float32
  if impl == "cudnn":
    return _cudnn_attention(q, k, v, mask, mask_info, bias, scale)
  if impl == "chunked" and not return_weights:
    chunk = options.chunk_size
    return _chunked_attention(
      q, k, v, mask, mask_info, bias, rate, dropout_rng, chunk, scale, kernels.bernoulli,
      options.softcap,
    )  # fmt: skip
  if mask_info is not None:
    mask = combine_masks(mask, mask_info.block_mask())
  if impl == "jax" and not use_dropout and not return_weights and options.softcap is None:
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale)
    return out.astype(q.dtype)
  attend = functools.partial(
    _xla_attention, scale=scale, bernoulli=kernels.bernoulli, softcap=options.softcap
  )
  blocks = 1 if return_weights else kernels.causal_query_blocks(q.shape[1], k.shape[1], mask_info)
  if blocks > 1:
    return causal_block_attention(attend, q, k, v, mask, bias, rate, dropout_rng, blocks)
  return attend(q, k, v, mask, bias, rate, dropout_rng, return_weights=return_weights)


def _cudnn_attention(q, k, v, mask, mask_info, bias, scale) -> jax.Array:
  """cuDNN flash attention, `jax.nn.dot_product_attention(implementation='cudnn')`.

  Causal attention and its window are the API's own `is_causal` / `local_window_size`
  (cuDNN skips the masked blocks). The API has no segment ids, so segments (packing,
  padding), a prefix-LM mask, a bidirectional window (cuDNN's window is causal-only) and
  a dense `mask` go as a dense [B, 1, T, S] mask, which cuDNN adds as a bias. A logit
  bias is cast to the compute dtype. With a mask or bias and an odd length, one query
  and / or key is appended and hidden: cuDNN's backward with a bias needs even lengths.
  """
  t, s = q.shape[1], k.shape[1]
  is_causal, window = False, None
  if mask_info is not None:
    if mask_info.causal and mask_info.q_prefix is None:
      is_causal = True
      window = None if mask_info.window is None else (mask_info.window - 1, 0)
      mask_info = mask_info.replace(causal=False, window=None)  # the segments remain
    mask = combine_masks(mask, mask_info.block_mask())  # [B|1, 1, T, S] or None
  if bias is not None:
    bias = bias.astype(q.dtype)  # [B|1, N|1, T, S]
  if (mask is not None or bias is not None) and (t % 2 or s % 2):
    tp, sp = t + t % 2, s + s % 2
    q = _pad_axis(q, 1, tp, 0)  # [B, Tp, N, H]
    k, v = _pad_axis(k, 1, sp, 0), _pad_axis(v, 1, sp, 0)  # [B, Sp, K, H]
    key_ok = (jnp.arange(sp) < s)[None, None, None, :]  # [1, 1, 1, Sp]
    if mask is not None:
      mask = _pad_axis(_pad_axis(jnp.asarray(mask, bool), 2, tp, True), 3, sp, False)
    mask = combine_masks(mask, key_ok)  # [B|1, 1, Tp, Sp]
    bias = _pad_axis(_pad_axis(bias, 2, tp, 0), 3, sp, 0)
  out = jax.nn.dot_product_attention(
    q,
    k,
    v,
    bias=bias,
    mask=mask,
    scale=scale,
    is_causal=is_causal,
    local_window_size=window,
    implementation="cudnn",
  )  # [B, Tp, N, H]
  return out[:, :t].astype(q.dtype)  # [B, T, N, H]


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(logits / cap) (Gemma 2's attention and final logits); logits if cap is None."""
  return logits if cap is None else cap * jnp.tanh(logits / cap)


def _xla_attention(
  q, k, v, mask, bias, dropout_rate, dropout_rng, return_weights=False, *, scale, bernoulli,
  softcap=None,
):  # fmt: skip
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  q = q * jnp.asarray(scale, q.dtype)
  if kv == n:  # MHA: plain 4-D contractions (cheaper layouts for XLA:CPU than G = 1)
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.float32)
  else:
    q = q.reshape(b, t, kv, n // kv, h)  # [B, T, K, G, H]
    logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
  logits = logits.reshape(b, n, t, s)  # [B, N, T, S]
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = soft_cap(logits, softcap)
  if mask is not None:
    logits = jnp.where(mask, logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)  # [B, N, T, S] float32
  probs = weights
  if dropout_rate > 0.0:
    keep = bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    probs = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  probs = probs.astype(v.dtype)
  if kv == n:
    out = jnp.einsum("BNTS,BSNH->BTNH", probs, v)  # [B, T, N, H]
  else:
    probs = probs.reshape(b, kv, n // kv, t, s)  # [B, K, G, T, S]
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v).reshape(b, t, n, h)  # [B, T, N, H]
  return (out, weights) if return_weights else out


def _pad_axis(x, axis, new_len, value):
  if x is None or x.shape[axis] == 1 or x.shape[axis] == new_len:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, new_len - x.shape[axis])
  return jnp.pad(x, pad, constant_values=value)


def _chunked_attention(
  q, k, v, mask, mask_info, bias, dropout_rate, dropout_rng, chunk, scale, bernoulli: Callable,
  softcap=None,
):  # fmt: skip
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  g = n // kv
  qc, kc = min(chunk, t), min(chunk, s)
  nq, nk = math.ceil(t / qc), math.ceil(s / kc)
  tp, sp = nq * qc, nk * kc
  block_bias, q_pos, kv_pos = None, None, None
  if isinstance(bias, BlockBias):  # built per block at the (padded) MaskInfo positions
    if mask_info is None:
      raise ValueError("a BlockBias needs mask_info: it is built at the MaskInfo positions")
    block_bias, bias = bias, None
    q_pos = _pad_axis(mask_info.q_positions, 1, tp, 0)  # [B, tp]
    kv_pos = _pad_axis(mask_info.kv_positions, 1, sp, 0)  # [B, sp]
  q_unscaled = _pad_axis(q, 1, tp, 0)  # [B, tp, N, H]: what a query-dependent bias reads
  q = q_unscaled * jnp.asarray(scale, q.dtype)
  k, v = _pad_axis(k, 1, sp, 0), _pad_axis(v, 1, sp, 0)
  mask = _pad_axis(_pad_axis(mask, 2, tp, False), 3, sp, False)
  bias = _pad_axis(_pad_axis(bias, 2, tp, 0.0), 3, sp, 0.0)
  if mask_info is not None:
    mask_info = mask_info.replace(
      q_segment_ids=_pad_axis(mask_info.q_segment_ids, 1, tp, -1),
      kv_segment_ids=_pad_axis(mask_info.kv_segment_ids, 1, sp, -2),
      q_prefix=_pad_axis(mask_info.q_prefix, 1, tp, False),
      kv_prefix=_pad_axis(mask_info.kv_prefix, 1, sp, False),
    )
  q_blocks = q.reshape(b, nq, qc, kv, g, h).swapaxes(0, 1)  # [nq, B, qc, K, G, H]

  @jax.checkpoint
  def one_query_block(qi, q_blk):
    if block_bias is not None:
      q_unscaled_blk = lax.dynamic_slice_in_dim(q_unscaled, qi * qc, qc, axis=1)  # [B, qc, N, H]
      q_pos_blk = lax.dynamic_slice_in_dim(q_pos, qi * qc, qc, axis=1)  # [B, qc]

    def step(carry, kj):
      out, row_max, denom = carry
      k_blk = lax.dynamic_slice_in_dim(k, kj * kc, kc, axis=1)  # [B, kc, K, H]
      v_blk = lax.dynamic_slice_in_dim(v, kj * kc, kc, axis=1)  # [B, kc, K, H]
      logits = jnp.einsum(
        "BTKGH,BSKH->BKGTS", q_blk, k_blk, preferred_element_type=jnp.float32
      ).reshape(b, n, qc, kc)  # [B, N, qc, kc]
      if bias is not None:
        logits = logits + slice_broadcast(
          slice_broadcast(bias, 2, qi * qc, qc), 3, kj * kc, kc
        ).astype(jnp.float32)
      if block_bias is not None:
        kv_pos_blk = lax.dynamic_slice_in_dim(kv_pos, kj * kc, kc, axis=1)  # [B, kc]
        logits = logits + block_bias(q_unscaled_blk, q_pos_blk, kv_pos_blk).astype(jnp.float32)
      logits = soft_cap(logits, softcap)
      block_mask = slice_broadcast(slice_broadcast(mask, 2, qi * qc, qc), 3, kj * kc, kc)
      if mask_info is not None:
        block_mask = combine_masks(block_mask, mask_info.block_mask(qi * qc, qc, kj * kc, kc))
      if block_mask is not None:
        logits = jnp.where(block_mask, logits, MASK_VALUE)
      # Keys past S (padding added here) get exactly zero weight.
      valid_key = (kj * kc + jnp.arange(kc)) < s  # [kc]
      logits = jnp.where(valid_key, logits, -jnp.inf)
      new_max = jnp.maximum(row_max, logits.max(axis=-1))  # [B, N, qc]
      p = jnp.exp(logits - new_max[..., None])  # [B, N, qc, kc]
      correction = jnp.exp(row_max - new_max)  # [B, N, qc]
      denom = denom * correction + p.sum(axis=-1)
      if dropout_rate > 0.0:
        rng = jax.random.fold_in(dropout_rng, qi * nk + kj)
        keep = bernoulli(rng, 1.0 - dropout_rate, p.shape)
        p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
      pv = jnp.einsum(
        "BKGTS,BSKH->BKGTH",
        p.astype(v.dtype).reshape(b, kv, g, qc, kc),
        v_blk,
        preferred_element_type=jnp.float32,
      ).reshape(b, n, qc, h)  # [B, N, qc, H]
      out = out * correction[..., None] + pv
      return (out, new_max, denom), None

    init = (
      jnp.zeros((b, n, qc, h), jnp.float32),
      jnp.full((b, n, qc), -jnp.inf, jnp.float32),
      jnp.zeros((b, n, qc), jnp.float32),
    )
    (out, _, denom), _ = lax.scan(step, init, jnp.arange(nk))
    return out / denom[..., None]  # [B, N, qc, H]

  blocks = lax.map(lambda args: one_query_block(*args), (jnp.arange(nq), q_blocks))
  out = blocks.transpose(1, 0, 3, 2, 4).reshape(b, tp, n, h)[:, :t]  # [B, T, N, H]
  return out.astype(q.dtype)
