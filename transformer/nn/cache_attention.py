"""Attention over the KV cache while decoding, and the cache's layout and length.

Letters: R query rows, B cache rows, T query length, S cache length, N query heads,
K key/value heads, G = N // K, H head dim.

Layout: cached keys and values are [B * K, S, H] (row b's head k at b * K + k), exactly
the operand of both products of a step, q k^T and p v, batched over B * K: XLA updates
the cache in place and the dots read it where it lies. With a [B, S, K, H] cache XLA:CPU
transposes every layer's whole cache at every step, and with a [B, K, S, H] one, reshaped
for the product, it copies the whole cache at batch 1 (docs/PERFORMANCE.md, "Decoding").

Length: a cache holds S slots and attention runs over all of them (slots not written yet
are masked: causality by index, segment id 0), so a step costs O(S). `model.init`
creates S = config.max_len; the decoding loops start shorter and `resize` the cache as it
fills (`transformer.decode.cache`).

Beams share their source: cross-attention keys and values are computed once per source,
[B * K, S, H], and serve R = r * B query rows (rows b * r ... b * r + r - 1 are the r
beams of source b) by folding the beams into the query axis.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn.kernels import MASK_VALUE, soft_cap
from transformer.nn.masks import BlockBias, MaskInfo

# The self-attention cache variables, and their length axis counted from the end.
LENGTH_AXES = {
  "cached_key": -2,
  "cached_value": -2,
  "cached_latent": -2,  # latent attention's [B, S, C + R] (`mla.py`)
  "cached_positions": -1,
  "cached_segment_ids": -1,
}
# The cross-attention cache variables: one per source, shared by its beams.
SOURCE_LEAVES = ("cross_key", "cross_value")


def to_cache_layout(x: jax.Array) -> jax.Array:
  """Keys or values [B, T, K, H] -> [B * K, T, H]."""
  b, t, kv, h = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b * kv, t, h)


def write(cache: jax.Array, new: jax.Array, index: jax.Array | int) -> jax.Array:
  """Writes new [B, T, K, H] into cache [B * K, S, H] at slots [index, index + T)."""
  return lax.dynamic_update_slice(cache, to_cache_layout(new).astype(cache.dtype), (0, index, 0))


def update(
  module: Any, new: dict[str, jax.Array], info: MaskInfo
) -> tuple[dict[str, jax.Array], MaskInfo]:
  """Writes each of `new` (cache variable -> [B, T, K, F]) at the cache index of the
  Flax `module`'s 'cache' collection, with the queries' positions and segment ids; returns
  the whole caches, [B * K, S, F] each, and the info of the queries over them.

  S is the cache's own length: `model.init` creates config.max_len slots, the decoding
  loops resize it (`resize`); writing past S is the caller's error. A prefix (prefix-LM)
  must arrive whole in one call, as the prompt of a prefill: its keys past the call are
  not cached yet, and later calls' queries see earlier keys causally anyway.
  """
  b, t = info.q_positions.shape
  slots = module.config.max_len
  initialized = module.has_variable("cache", "cache_index")
  caches = {
    name: module.variable("cache", name, jnp.zeros, (b * x.shape[2], slots, x.shape[3]), x.dtype)
    for name, x in new.items()
  }
  cached_pos = module.variable("cache", "cached_positions", jnp.zeros, (b, slots), jnp.int32)
  cached_seg = module.variable("cache", "cached_segment_ids", jnp.zeros, (b, slots), jnp.int32)
  index = module.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
  if not initialized:  # Creating the cache (model.init): nothing to attend over yet.
    return {name: to_cache_layout(x) for name, x in new.items()}, info
  i = index.value
  for name, x in new.items():
    caches[name].value = write(caches[name].value, x, i)  # [B * K, S, F]
  s = cached_pos.value.shape[1]
  cached_pos.value = lax.dynamic_update_slice(
    cached_pos.value, info.q_positions.astype(jnp.int32), (0, i)
  )
  q_seg = info.q_segment_ids
  if q_seg is None:
    q_seg = jnp.ones((b, t), jnp.int32)
  cached_seg.value = lax.dynamic_update_slice(cached_seg.value, q_seg.astype(jnp.int32), (0, i))
  index.value = i + t
  kv_prefix = None
  if info.q_prefix is not None:
    kv_prefix = lax.dynamic_update_slice(jnp.zeros((b, s), bool), info.q_prefix, (0, i))  # [B, S]
  info = MaskInfo(
    q_positions=info.q_positions,
    kv_positions=cached_pos.value,
    q_segment_ids=q_seg.astype(jnp.int32),
    kv_segment_ids=cached_seg.value,
    q_offset=i,
    causal=True,
    window=info.window,
    q_prefix=info.q_prefix,
    kv_prefix=kv_prefix,
  )
  return {name: v.value for name, v in caches.items()}, info


def attend(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  info: MaskInfo,
  kv_heads: int,
  bias: jax.Array | BlockBias | None = None,
  scale: float | None = None,
  softcap: float | None = None,
) -> jax.Array:
  """softmax(scale * q k^T + bias, masked by `info`) v over cached keys and values.

  q: [R, T, N, H] with R = r * B (r > 1: r beams per cache row, cross-attention only);
  k: [B * K, S, H] with K = kv_heads, v: [B * K, S, F] (F = H but for latent attention,
  `mla.py`); info: the queries' MaskInfo over the S cached
  keys; bias: float
  [R|1, N, T, S] or a `BlockBias` (r = 1 only); scale: None = H**-0.5; softcap: the
  scores' soft cap (`kernels.soft_cap`), None = none. Masked logits and
  fully masked rows are treated as in `kernels.dot_product_attention`.
  Returns [R, T, N, F] in q's dtype.
  """
  rows, t, n, h = q.shape
  bk, s, _ = k.shape
  if isinstance(bias, BlockBias):
    bias = bias.dense(q, info)  # [R|1, N, T, S] float32
  kv = kv_heads
  b = bk // kv
  r, g = rows // b, n // kv
  if rows != r * b or n != g * kv or bk != b * kv:
    raise ValueError(f"queries [{rows}, {n} heads] do not fit a cache of {bk} = B * K rows")
  if r > 1:  # beams: each source's r rows become r * T queries of that source's row
    if info.causal or bias is not None:
      raise ValueError("rows share a cache row only in cross-attention (no causality, no bias)")
    info = info.replace(
      q_positions=info.q_positions.reshape(b, r * t),
      q_segment_ids=None if info.q_segment_ids is None else info.q_segment_ids.reshape(b, r * t),
    )
  scale = h**-0.5 if scale is None else scale
  q = (q * jnp.asarray(scale, q.dtype)).reshape(b, r * t, kv, g, h)  # [B, rT, K, G, H]
  q = q.transpose(0, 2, 3, 1, 4).reshape(bk, g * r * t, h)  # [B * K, G rT, H]
  logits = jnp.einsum("XQH,XSH->XQS", q, k, preferred_element_type=jnp.float32)
  logits = logits.reshape(b, kv, g, r * t, s)  # [B, K, G, rT, S]
  if bias is not None:
    logits = logits + bias.astype(jnp.float32).reshape(bias.shape[0], kv, g, t, s)
  logits = soft_cap(logits, softcap)
  mask = info.block_mask()  # [B|1, 1, rT, S] or None
  if mask is not None:
    logits = jnp.where(mask[:, :, None], logits, MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype).reshape(bk, g * r * t, s)
  f = v.shape[-1]
  out = jnp.einsum("XQS,XSF->XQF", probs, v).reshape(b, kv, g, r * t, f)  # [B, K, G, rT, F]
  return out.transpose(0, 3, 1, 2, 4).reshape(rows, t, n, f).astype(q.dtype)


def _name(path) -> str:
  last = path[-1]
  return str(getattr(last, "key", getattr(last, "name", last)))


def resize(cache: Any, length: int) -> Any:
  """`cache` (a 'cache' collection, arrays or `jax.ShapeDtypeStruct`s) with every
  self-attention leaf padded with empty slots, or cut, to `length` slots.

  Cutting keeps slots [0, length): only valid while the cache index is <= length.
  Cross-attention leaves (the source's length) and the cache index are unchanged.
  """

  def one(path, x):
    axis = LENGTH_AXES.get(_name(path))
    if axis is None:
      return x
    axis += len(x.shape)
    shape = x.shape[:axis] + (length,) + x.shape[axis + 1 :]
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(shape, x.dtype)
    if x.shape[axis] >= length:
      return lax.slice_in_dim(x, 0, length, axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad)

  return jax.tree_util.tree_map_with_path(one, cache)


def is_source_leaf(path) -> bool:
  """Whether a cache leaf at `path` holds cross-attention keys or values (one per source)."""
  return _name(path) in SOURCE_LEAVES
