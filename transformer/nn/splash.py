"""Splash attention: the Pallas TPU kernel (block-sparse flash attention) on `MaskInfo` masks.

Letters: B batch, T query length, S key length, N query heads, K key/value heads,
G = N // K, H head dim.

`splash_attention` runs `jax.experimental.pallas.ops.tpu.splash_attention` (shipped in
the jax wheel) with the parts of a `MaskInfo` it can express as the kernel's own masks,
so that fully masked blocks are skipped and no [T, S] mask exists:

  causal, query offset 0       `CausalMask`; with a window, `LocalMask((w - 1, 0))`
  bidirectional window         `LocalMask((w - 1, w - 1))`  (|t - s| < w)
  segment ids (0 = padding)    `SegmentIds`: the kernel compares them as `MaskInfo` does
  GQA (1 < K < N)              the MHA kernel's own grouping: query head n reads key/value
                               head n // G, as everywhere here
  MQA (K = 1)                  the MQA kernel (one key/value head for every query head)

The kernel does not scale q: q is multiplied by `scale` first, in q's dtype as the 'xla'
path does. Lengths are padded up to the block sizes; padded positions get a segment id of
their own (-1), so real queries never see them. Block sizes (`ModelConfig.splash_block_q`,
`splash_block_kv`, multiples of 128) shrink to the padded length when it is shorter; the
backward kernels use the same blocks.

`kernels.dot_product_attention` sends here only what the kernel supports; it has no logit
bias, no attention dropout, no prefix-LM mask (a mask that depends on the data), no query
offset that is only known at run time (cached decoding) and does not return weights.

Under `partitioning.activation_layout` the kernel runs per shard (`partitioning.map_shards`,
a shard_map as in MaxText): the batch over the data and fsdp axes, heads over the tensor
axis; the kernel is built for the shard's shapes. Without a layout it is called directly.

`INTERPRET = True` runs the kernel in Pallas interpret mode, on any backend: how the tests
check it on the CPU. It is off by default, and nothing in the project turns it on.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn import partitioning
from transformer.nn.masks import MaskInfo

INTERPRET = False  # Pallas interpret mode (tests on the CPU); never on for real runs
LANES = 128  # block sizes are multiples of the TPU lane count
PAD_SEGMENT = -1  # segment id of the positions added to reach a block multiple


def available(platform: str) -> bool:
  """Whether splash attention can run on `platform` ('tpu', or anywhere in interpret mode)."""
  return platform == "tpu" or INTERPRET


def blocks_for(length: int, block: int) -> tuple[int, int]:
  """(block used, padded length) for a sequence of `length`: the block shrinks to the
  length rounded up to 128 when that is shorter, and the length is padded to the block."""
  used = min(block, _round_up(length, LANES))
  return used, _round_up(length, used)


def splash_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask_info: MaskInfo | None,
  *,
  scale: float,
  block_q: int = 512,
  block_kv: int = 512,
) -> jax.Array:
  """softmax(scale * q k^T, masked by `mask_info`) v with the splash kernel.

  Args:
    q: [B, T, N, H]; k, v: [B, S, K, H] with N % K == 0.
    mask_info: causal / window / segment ids; no prefix, query offset 0 (the caller
      checks). None = every query sees every key.
    scale: the score multiplier.
    block_q, block_kv: kernel blocks (multiples of 128).
  Returns:
    [B, T, N, H] in q's dtype.
  """
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  bq, tp = blocks_for(t, block_q)
  bkv, sp = blocks_for(s, block_kv)
  causal = mask_info is not None and mask_info.causal
  window = None if mask_info is None else mask_info.window
  q_seg, kv_seg = _segment_ids(mask_info, b, t, s, tp, sp)
  q = _pad(q * jnp.asarray(scale, q.dtype), 1, tp).transpose(0, 2, 1, 3)  # [B, N, Tp, H]
  k = _pad(k, 1, sp).transpose(0, 2, 1, 3)  # [B, K, Sp, H]
  v = _pad(v, 1, sp).transpose(0, 2, 1, 3)  # [B, K, Sp, H]

  def per_shard(q, k, v, q_seg, kv_seg):
    kernel = _kernel(q.shape[1], k.shape[1] == 1, tp, sp, causal, window, bq, bkv)
    return _rows(kernel, q, k, v, q_seg, kv_seg)  # [b, n, Tp, H]

  heads, kv_heads = _head_axes(n, kv)
  out = partitioning.map_shards(
    per_shard,
    (q, k, v, q_seg, kv_seg),
    (
      ("batch", heads, None, None),
      ("batch", kv_heads, None, None),
      ("batch", kv_heads, None, None),
      ("batch", None),
      ("batch", None),
    ),
    ("batch", heads, None, None),
  )  # [B, N, Tp, H]
  return out.transpose(0, 2, 1, 3)[:, :t].astype(q.dtype)  # [B, T, N, H]


def sequence_sharded_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask_info: MaskInfo | None,
  *,
  scale: float,
  block_q: int,
  block_kv: int,
  context: int,
) -> jax.Array:
  """`splash_attention` with the queries split along the mesh's 'context' axis
  (all-gather context parallelism, `nn/context.py`): each device attends its T / context
  queries over the whole K/V, which the shard_map's specs gather. The kernel is built for
  the whole [T, S] mask with `q_seq_shards=context`; each device gets its rows of the
  kernel's mask data (`manual_sharding_spec`), global query indices included, so causal
  masks and windows stay right at every offset.

  Each device's queries must fill whole blocks: T / context a multiple of 128.
  """
  b, t, n, h = q.shape
  s, kv = k.shape[1], k.shape[2]
  piece = t // context
  bq = min(block_q, piece)
  if piece % LANES or piece % bq:
    raise ValueError(
      f"splash attention under mesh.context={context}: each device's {piece} queries must"
      f" fill whole blocks of {LANES}; use a sequence length that is a multiple of"
      f" {context * LANES}, or attention_impl='xla'"
    )
  bkv, sp = blocks_for(s, block_kv)
  causal = mask_info is not None and mask_info.causal
  window = None if mask_info is None else mask_info.window
  q_seg, kv_seg = _segment_ids(mask_info, b, t, s, t, sp)
  q = (q * jnp.asarray(scale, q.dtype)).transpose(0, 2, 1, 3)  # [B, N, T, H]
  k = _pad(k, 1, sp).transpose(0, 2, 1, 3)  # [B, K, Sp, H]
  v = _pad(v, 1, sp).transpose(0, 2, 1, 3)  # [B, K, Sp, H]
  mesh, rules = partitioning.active_layout()
  heads, kv_heads = _head_axes(n, kv)
  spec = lambda axes, shape: partitioning.spec_for(axes, shape, mesh, rules)
  batch = spec(("batch",), (b,))[0]
  head_axis = spec((heads,), (n,))[0]
  kv_head_axis = spec((kv_heads,), (kv,))[0]
  head_names = (head_axis,) if isinstance(head_axis, str) else tuple(head_axis or ())
  head_shards = int(np.prod([mesh.shape[a] for a in head_names])) if head_names else 1
  kv_names = (kv_head_axis,) if isinstance(kv_head_axis, str) else tuple(kv_head_axis or ())
  local_kv = kv // int(np.prod([mesh.shape[a] for a in kv_names])) if kv_names else kv
  kernel = _kernel(n, local_kv == 1, t, sp, causal, window, bq, bkv, head_shards, context)
  kernel_spec = kernel.manual_sharding_spec(
    jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(head_axis, "context"))
  )
  P = jax.sharding.PartitionSpec
  specs = [kernel_spec, P(batch, head_axis, "context", None)]
  specs += [P(batch, kv_head_axis, None, None)] * 2
  args = [kernel, q, k, v]
  if q_seg is not None:
    specs += [P(batch, "context"), P(batch, None)]
    args += [q_seg, kv_seg]

  out = jax.shard_map(
    _rows,
    mesh=mesh,
    in_specs=tuple(specs),
    out_specs=P(batch, head_axis, "context", None),
    check_vma=False,
  )(*args)  # [B, N, T, H]
  return out.transpose(0, 2, 1, 3).astype(q.dtype)  # [B, T, N, H]


def _pallas() -> tuple[Any, Any]:
  """jax's splash kernel and mask modules, imported when a kernel is first built: importing
  Pallas's TPU kernels takes time that a run that never uses them (every run off a TPU)
  does not spend."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel,
    splash_attention_mask,
  )

  return splash_attention_kernel, splash_attention_mask


def _rows(kernel, q, k, v, q_seg=None, kv_seg=None) -> jax.Array:
  """The kernel over each row of one device's q [b, n, t, H], k, v [b, k, s, H] and
  segment ids [b, t], [b, s] (None: none): [b, n, t, H]."""
  if k.shape[1] == 1:  # MQA: the kernel takes one [s, H] key/value per row
    k, v = k[:, 0], v[:, 0]  # [b, s, H]
  if q_seg is None:
    return jax.vmap(kernel)(q, k, v)
  segment_ids = _pallas()[0].SegmentIds
  attend = lambda q, k, v, qs, ks: kernel(q, k, v, segment_ids=segment_ids(qs, ks))
  return jax.vmap(attend)(q, k, v, q_seg, kv_seg)


def _kernel(n, mqa, tp, sp, causal, window, bq, bkv, head_shards=1, q_seq_shards=1) -> Any:
  """The kernel (a `SplashAttentionKernel`) for n query heads over [Tp, Sp] (mask processing
  is cached by jax); with shards, its mask data split over `head_shards` x `q_seq_shards`
  devices."""
  splash_kernel, splash_mask = _pallas()
  if window is not None:
    mask = splash_mask.LocalMask((tp, sp), (window - 1, 0 if causal else window - 1), offset=0)
  elif causal:
    mask = splash_mask.CausalMask((tp, sp))
  else:
    mask = splash_mask.FullMask((tp, sp))
  sizes = splash_kernel.BlockSizes(
    block_q=bq,
    block_kv=bkv,
    block_kv_compute=bkv,
    block_q_dkv=bq,
    block_kv_dkv=bkv,
    block_kv_dkv_compute=bkv,
    block_q_dq=bq,
    block_kv_dq=bkv,
  )
  make = splash_kernel.make_splash_mqa if mqa else splash_kernel.make_splash_mha
  return make(
    splash_mask.MultiHeadMask([mask] * n),
    block_sizes=sizes,
    head_shards=head_shards,
    q_seq_shards=q_seq_shards,
    interpret=INTERPRET,
  )


def _head_axes(n: int, kv: int) -> tuple[str | None, str | None]:
  """Logical axes of the query and key/value head dimensions for the shard_map.

  A shard must hold whole groups: its query heads read its own key/value heads. That
  holds when both split the same way, or when K = 1 stays whole; otherwise heads stay
  whole (replicated) in both.
  """
  layout = partitioning.active_layout()
  if layout is None:
    return "heads", "kv_heads"
  mesh, rules = layout
  q_spec = partitioning.spec_for(("heads",), (n,), mesh, rules)
  kv_spec = partitioning.spec_for(("kv_heads",), (kv,), mesh, rules)
  if q_spec == kv_spec or (kv == 1 and kv_spec[0] is None):
    return "heads", "kv_heads"
  return None, None


def _segment_ids(info, b, t, s, tp, sp) -> tuple[jax.Array | None, jax.Array | None]:
  """Query [B, Tp] and key [B, Sp] segment ids (padding: PAD_SEGMENT), or (None, None)."""
  q_seg = None if info is None else info.q_segment_ids
  kv_seg = None if info is None else info.kv_segment_ids
  if q_seg is None and tp == t and sp == s:
    return None, None
  if q_seg is None:
    q_seg, kv_seg = jnp.ones((b, t), jnp.int32), jnp.ones((b, s), jnp.int32)
  q_seg = jnp.broadcast_to(q_seg.astype(jnp.int32), (b, t))
  kv_seg = jnp.broadcast_to(kv_seg.astype(jnp.int32), (b, s))
  return _pad(q_seg, 1, tp, PAD_SEGMENT), _pad(kv_seg, 1, sp, PAD_SEGMENT)


def _pad(x: jax.Array, axis: int, length: int, value: int = 0) -> jax.Array:
  if x.shape[axis] == length:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _round_up(x: int, multiple: int) -> int:
  return int(np.ceil(x / multiple)) * multiple
