"""Context parallelism: attention with the sequence split over the mesh's 'context' axis.

Under a mesh with context = C > 1 every activation [B, T, ...] is split along T into C
contiguous pieces (the logical axis 'length', `partitioning.RULES`). Everything but
attention is per position and needs nothing more; attention needs every key. Two ways
to get them (`ModelConfig.context_attention`):

  'all_gather'  each device gathers the whole K/V (with their positions, segment ids and
                prefix flags) and attends its own T/C queries over all S keys. Simple; the
                right choice for GQA / MQA, whose K/V are small next to the queries.
  'ring'        no device holds the whole K/V: C steps, each attending the queries over
                the K/V piece it holds, then passing the piece on around the ring
                (`lax.ppermute`), combined by online softmax (the FlashAttention
                recurrence). Causal attention is load-balanced by the zig-zag order: the
                sequence is cut into 2C chunks and device d attends for chunks d and
                2C - 1 - d, so every device has the same number of unmasked score blocks
                (`unmasked_blocks`). The zig-zag is applied to this layer's q, k, v and
                undone on its output inside the attention, so the rest of the model keeps
                the plain order.

Masks are built from the global key indices of the pieces a device holds
(`MaskInfo.mask_at`), position biases (ALiBi, T5, Shaw) from their positions
(`BlockBias`), so causal, padding, packed segments, prefix-LM and sliding windows need no
special case. Each block's scores are recomputed in the backward pass (`jax.checkpoint`),
as in the chunked kernel: a device keeps no [T, S] scores, only [T/C, S/C] per step
('ring') or [T/C, S] ('all_gather').

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
G = N // K, H head dim; b, t, s, n, k: one device's piece of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer.nn import partitioning
from transformer.nn.masks import MASK_VALUE, BlockBias, MaskInfo

AXIS = "context"  # the mesh axis the sequence is split over
STRATEGIES = ("all_gather", "ring")


def zigzag_chunks(context: int) -> list[tuple[int, int]]:
  """The two of 2C sequence chunks device d holds in the zig-zag order: (d, 2C - 1 - d)."""
  return [(d, 2 * context - 1 - d) for d in range(context)]


def unmasked_blocks(context: int, zigzag: bool = True) -> list[int]:
  """Per device, the (query chunk, key chunk) pairs of causal attention over 2C equal
  chunks that have at least one unmasked score: the work each device does."""
  if zigzag:
    held = zigzag_chunks(context)
  else:
    held = [(2 * d, 2 * d + 1) for d in range(context)]
  every = [c for pair in held for c in pair]
  return [sum(1 for q in pair for k in every if k <= q) for pair in held]


def attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  info: MaskInfo | None,
  bias: BlockBias | None,
  *,
  strategy: str,
  scale: float,
  softcap: float | None,
) -> jax.Array:
  """softmax(scale * q k^T + bias, masked) v with T and S split over the 'context' axis.

  q [B, T, N, H], k, v [B, S, K, H] (global shapes, called inside the active
  `partitioning.activation_layout`); `info` gives the mask, `bias` is a position bias
  built per block, or None. Returns [B, T, N, H] in q's dtype, laid out as q.
  """
  context = partitioning.context_size()
  if strategy not in STRATEGIES:
    raise ValueError(f"context_attention={strategy!r}; expected one of {STRATEGIES}")
  b, t, n, _ = q.shape
  s = k.shape[1]
  zigzag = strategy == "ring" and info is not None and info.causal
  pieces = 2 * context if zigzag else context
  for name, length in (("query", t), ("key", s)):
    if length % pieces:
      why = f"mesh.context={context}" + (", x2 for ring attention's zig-zag" if zigzag else "")
      raise ValueError(
        f"context parallelism: the {name} length {length} must be divisible by {pieces}"
        f" ({why}); set seq_len / data.target_seq_len (images: the patch count) to fit"
      )
  if info is None:
    info = MaskInfo.create(jnp.ones((b, t), jnp.int32), jnp.ones((b, s), jnp.int32))
  # Decoding runs outside the mesh layout, so it never gets here; `nn.remat` traces the 0
  # offset of a full pass, which counts as 0 (as in `kernel_rules`).
  if not isinstance(info.q_offset, jax.core.Tracer) and info.q_offset != 0:
    raise ValueError("context parallelism does not run while decoding (a query offset)")
  params = [] if bias is None else jax.tree.leaves(bias.params)
  treedef = None if bias is None else jax.tree.structure(bias.params)
  seq, kv_axes = ("batch", "length"), ("batch", "length", "kv_heads", "head_dim")
  q_axes = ("batch", "length", "heads", "head_dim")
  args = (
    q, k, v, info.q_positions, info.kv_positions, info.q_segment_ids, info.kv_segment_ids,
    info.q_prefix, info.kv_prefix, *params,
  )  # fmt: skip
  in_axes = (q_axes, kv_axes, kv_axes, seq, seq, seq, seq, seq, seq) + tuple(
    (None,) * p.ndim for p in params
  )
  heads_axis = _heads_axis(n)

  def per_shard(q, k, v, q_pos, kv_pos, q_seg, kv_seg, q_pre, kv_pre, *leaves):
    block_bias = None
    if bias is not None:
      block_bias = BlockBias(bias.fn, jax.tree.unflatten(treedef, leaves))
    q_side = [q, q_pos, q_seg, q_pre]
    kv_side = [k, v, kv_pos, kv_seg, kv_pre]
    if zigzag:
      q_side = [_to_zigzag(x, context) for x in q_side]
      kv_side = [_to_zigzag(x, context) for x in kv_side]
    q_idx = _indices(q.shape[1], context, zigzag)
    kv_idx = _indices(k.shape[1], context, zigzag)
    if strategy == "all_gather":
      gather = lambda x: lax.all_gather(x, AXIS, axis=1, tiled=True)
      kv_side = [None if x is None else gather(x) for x in kv_side]
      kv_idx = jnp.arange(s)
    attend = _Attend(info, block_bias, scale, softcap, heads_axis, n)
    out = attend.run(strategy, q_side, q_idx, kv_side, kv_idx, context)
    return _from_zigzag(out, context) if zigzag else out

  return partitioning.map_shards(per_shard, args, in_axes, q_axes)


class _Attend:
  """One device's attention over the K/V pieces it is given, by online softmax."""

  def __init__(self, info, bias, scale, softcap, heads_axis, heads):
    self.info, self.bias, self.scale, self.softcap = info, bias, scale, softcap
    self.heads_axis, self.heads = heads_axis, heads

  def run(self, strategy, q_side, q_idx, kv_side, kv_idx, context):
    q = q_side[0]
    b, t, n, h = q.shape
    acc = (
      jnp.zeros((b, n, t, h), jnp.float32),
      jnp.full((b, n, t), -jnp.inf, jnp.float32),
      jnp.zeros((b, n, t), jnp.float32),
    )
    steps = context if strategy == "ring" else 1
    ring = [(i, (i + 1) % context) for i in range(context)]
    for step in range(steps):
      if step:  # the piece this device holds moves on; the previous device's arrives
        kv_side = [None if x is None else lax.ppermute(x, AXIS, ring) for x in kv_side]
        kv_idx = lax.ppermute(kv_idx, AXIS, ring)
      part = jax.checkpoint(self.block)(q_side, q_idx, kv_side, kv_idx)
      acc = _combine(acc, part)
    out, _, denom = acc
    return (out / denom[..., None]).transpose(0, 2, 1, 3).astype(q.dtype)  # [b, t, n, h]

  def block(self, q_side, q_idx, kv_side, kv_idx):
    """Unnormalised output, row max and row sum of the queries over one K/V piece."""
    q, q_pos, q_seg, q_pre = q_side
    k, v, kv_pos, kv_seg, kv_pre = kv_side
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    g = n // kv
    qs = (q * jnp.asarray(self.scale, q.dtype)).reshape(b, t, kv, g, h)
    logits = jnp.einsum("BTKGH,BSKH->BKGTS", qs, k, preferred_element_type=jnp.float32)
    logits = logits.reshape(b, n, t, s)
    if self.bias is not None:
      logits = logits + self._local_heads(self.bias(q, q_pos, kv_pos)).astype(jnp.float32)
    if self.softcap is not None:
      logits = self.softcap * jnp.tanh(logits / self.softcap)
    mask = self.info.mask_at(q_idx, kv_idx, q_seg, kv_seg, q_pre, kv_pre)  # [b|1, 1, t, s]
    logits = jnp.where(mask, logits, MASK_VALUE)
    row_max = logits.max(axis=-1)  # [b, n, t]
    p = jnp.exp(logits - row_max[..., None])
    out = jnp.einsum(
      "BKGTS,BSKH->BKGTH", p.astype(v.dtype).reshape(b, kv, g, t, s), v,
      preferred_element_type=jnp.float32,
    ).reshape(b, n, t, h)  # fmt: skip
    return out, row_max, p.sum(axis=-1)

  def _local_heads(self, bias: jax.Array) -> jax.Array:
    """A bias over all N heads cut to this device's heads (heads split over 'tensor')."""
    if self.heads_axis is None or bias.shape[1] == 1:
      return bias
    local = self.heads // _axis_size(self.heads_axis)
    start = lax.axis_index(self.heads_axis) * local
    return lax.dynamic_slice_in_dim(bias, start, local, axis=1)


def _combine(acc, part):
  """Online softmax: two (unnormalised output, row max, row sum) over disjoint keys."""
  out, row_max, denom = acc
  p_out, p_max, p_denom = part
  new_max = jnp.maximum(row_max, p_max)
  a, c = jnp.exp(row_max - new_max), jnp.exp(p_max - new_max)
  return out * a[..., None] + p_out * c[..., None], new_max, denom * a + p_denom * c


def _heads_axis(n: int) -> str | tuple[str, ...] | None:
  """The mesh axis (or axes) the query heads are split over in the active layout."""
  mesh, rules = partitioning.active_layout()
  return partitioning.spec_for(("heads",), (n,), mesh, rules)[0]


def _axis_size(axis) -> int:
  names = (axis,) if isinstance(axis, str) else axis
  return int(np.prod([lax.axis_size(a) for a in names]))


def _indices(piece: int, context: int, zigzag: bool) -> jax.Array:
  """Global sequence indices of the piece of `piece` positions this device holds."""
  d = lax.axis_index(AXIS)
  if not zigzag:
    return d * piece + jnp.arange(piece)
  half = piece // 2
  first = d * half + jnp.arange(half)
  second = (2 * context - 1 - d) * half + jnp.arange(half)
  return jnp.concatenate([first, second])


def _swap_perms(context: int) -> tuple[list, list]:
  """ppermute pairs sending each device's first and second half-piece (global chunks 2d
  and 2d + 1) to the device that holds them in the zig-zag order."""
  home = {}
  for d, (a, z) in enumerate(zigzag_chunks(context)):
    home[a], home[z] = d, d
  first = [(d, home[2 * d]) for d in range(context)]
  second = [(d, home[2 * d + 1]) for d in range(context)]
  return first, second


def _to_zigzag(x: jax.Array | None, context: int) -> jax.Array | None:
  """[b, piece, ...] in the plain order -> this device's zig-zag chunks (d, 2C - 1 - d)."""
  if x is None:
    return None
  half = x.shape[1] // 2
  first, second = _swap_perms(context)
  got_first = lax.ppermute(x[:, :half], AXIS, first)  # chunk 2e on its way to its home
  got_second = lax.ppermute(x[:, half:], AXIS, second)
  # Device d receives one chunk by each: chunk d (it is the lower of its pair) and chunk
  # 2C - 1 - d. For even d, chunk d is some device's first half; for odd d, a second half.
  even = lax.axis_index(AXIS) % 2 == 0
  low = jnp.where(even, got_first, got_second)
  high = jnp.where(even, got_second, got_first)
  return jnp.concatenate([low, high], axis=1)


def _from_zigzag(x: jax.Array, context: int) -> jax.Array:
  """The inverse of `_to_zigzag`."""
  half = x.shape[1] // 2
  low, high = x[:, :half], x[:, half:]
  even = lax.axis_index(AXIS) % 2 == 0
  first, second = _swap_perms(context)
  back_first = lax.ppermute(jnp.where(even, low, high), AXIS, [(b, a) for a, b in first])
  back_second = lax.ppermute(jnp.where(even, high, low), AXIS, [(b, a) for a, b in second])
  return jnp.concatenate([back_first, back_second], axis=1)
