"""Attention: masks, dot_product_attention (xla | jax | chunked), MultiHeadAttention.

Every case compares against the float64 reference in `reference_numpy.py`; gradients are
checked against float64 PyTorch autograd. Shapes are tiny: compilation dominates the cost.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref
import torch

from transformer.nn import masks
from transformer.nn.attention import MultiHeadAttention
from transformer.nn.kernel_rules import AttentionOptions
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo
from transformer.ops import causal_blocks

IMPLS = ("xla", "jax", "chunked")
TOL = dict(rtol=1e-5, atol=1e-5)


def _qkv(b, t, s, n, k, h, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, t, n, h)).astype(np.float32)
  kk = rng.standard_normal((b, s, k, h)).astype(np.float32)
  v = rng.standard_normal((b, s, k, h)).astype(np.float32)
  return q, kk, v


def _all_impls(chunk_size):
  """One compiled function returning every implementation's output (one compile per case)."""

  @jax.jit
  def run(q, k, v, mask, info, bias):
    return {
      impl: dot_product_attention(
        q, k, v, info, AttentionOptions(impl, chunk_size), mask=mask, bias=bias
      )
      for impl in IMPLS
    }

  return run


# Each case: (B, T, S, N, K, H, chunk). Masks are built in the test body.
CASES = {
  # Dense random mask with a fully masked query row, per-head bias, MHA, cross-shaped T != S.
  "dense_mask_bias_mha": (2, 6, 9, 4, 4, 8, 4),
  # Packed segments (one padding slot, id 0) + causal MaskInfo, GQA.
  "causal_segments_gqa": (2, 7, 7, 4, 2, 8, 3),
  # Bidirectional window MaskInfo AND a dense key-padding mask, bias, MQA.
  "window_padding_bias_mqa": (2, 8, 8, 4, 1, 8, 3),
  # Decoding: 3 queries at key index 4.. over a 10-slot cache, causal window, GQA.
  "cache_offset_window_gqa": (1, 3, 10, 4, 2, 8, 4),
}


def _case_inputs(name):
  b, t, s, n, k, h, chunk = CASES[name]
  rng = np.random.default_rng(1)
  q, kk, v = _qkv(b, t, s, n, k, h)
  q_idx, kv_idx = np.arange(t), np.arange(s)
  mask = bias = info = None
  if name == "dense_mask_bias_mha":
    mask = rng.random((b, 1, t, s)) > 0.4
    mask[0, 0, 2] = False  # a row that sees nothing: uniform weights
    bias = rng.standard_normal((1, n, t, s)).astype(np.float32)
    ref_mask = mask
  elif name == "causal_segments_gqa":
    seg = np.array([[1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 3, 3, 3]], np.int32)
    info = MaskInfo.create(jnp.asarray(seg), causal=True)
    ref_mask = ref.reference_mask(q_idx, kv_idx, True, None, seg, seg)
  elif name == "window_padding_bias_mqa":
    info = MaskInfo.create(jnp.ones((b, t), jnp.int32), window=3)
    mask = np.ones((b, 1, 1, s), bool)
    mask[1, ..., 5:] = False
    bias = rng.standard_normal((b, n, t, s)).astype(np.float32)
    ref_mask = ref.reference_mask(q_idx, kv_idx, False, 3) & mask
  else:
    offset = 4
    q_pos = jnp.broadcast_to(offset + jnp.arange(t), (b, t))
    kv_pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    info = MaskInfo(q_pos, kv_pos, q_offset=jnp.int32(offset), causal=True, window=4)
    ref_mask = ref.reference_mask(offset + q_idx, kv_idx, True, 4)
  return (q, kk, v, mask, info, bias), ref_mask, chunk


@pytest.mark.parametrize("name", list(CASES))
def test_dot_product_attention_matches_reference_for_every_impl(name):
  (q, k, v, mask, info, bias), ref_mask, chunk = _case_inputs(name)
  outs = _all_impls(chunk)(q, k, v, mask, info, bias)
  expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), ref_mask, bias)
  for impl in IMPLS:
    assert outs[impl].shape == q.shape and outs[impl].dtype == jnp.float32
    np.testing.assert_allclose(outs[impl], expected, **TOL, err_msg=impl)


def _torch_attention(q, k, v, mask, bias):
  """Float64 PyTorch attention (q [B,T,N,H], k/v [B,S,K,H]) for autograd gradients."""
  g = q.shape[2] // k.shape[2]
  kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
  logits = torch.einsum("btnh,bsnh->bnts", q, kk) / q.shape[-1] ** 0.5 + bias
  logits = logits.masked_fill(~mask, float("-inf"))
  return torch.einsum("bnts,bsnh->btnh", torch.softmax(logits, -1), vv)


def test_gradients_of_every_impl_match_float64_autograd():
  """Packed causal MaskInfo AND a dense mask, bias, GQA, chunk 3 not dividing T = S = 7."""
  b, t, n, k, h = 2, 7, 4, 2, 8
  q, kk, v = _qkv(b, t, t, n, k, h, seed=3)
  rng = np.random.default_rng(4)
  bias = rng.standard_normal((b, n, t, t)).astype(np.float32)
  cotangent = rng.standard_normal((b, t, n, h)).astype(np.float32)
  seg = np.array([[1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1]], np.int32)
  dense = np.ones((b, 1, t, t), bool)
  dense[1, :, 3:, 1] = False  # hide key 1 from later queries of row 1
  info = MaskInfo.create(jnp.asarray(seg), causal=True)

  @jax.jit
  def grads(q, k, v, bias):
    def loss(impl, *args):
      out = dot_product_attention(
        *args[:3], info, AttentionOptions(impl, chunk_size=3), mask=dense, bias=args[3]
      )
      return jnp.sum(out * cotangent)

    return {impl: jax.grad(loss, argnums=(1, 2, 3, 4))(impl, q, k, v, bias) for impl in IMPLS}

  got = grads(q, kk, v, bias)
  tensors = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, kk, v, bias)]
  full_mask = torch.tensor(
    ref.reference_mask(np.arange(t), np.arange(t), True, None, seg, seg) & dense
  )
  out = _torch_attention(*tensors[:3], full_mask, tensors[3])
  (out * torch.tensor(cotangent, dtype=torch.float64)).sum().backward()
  for impl in IMPLS:
    for name, g, x in zip("qkvb", got[impl], tensors, strict=True):
      np.testing.assert_allclose(g, x.grad.numpy(), rtol=1e-4, atol=2e-5, err_msg=f"{impl} d{name}")


def test_causal_query_blocks_are_exact_in_values_and_gradients():
  """The causal 'xla' path splits T = S = 512 into 4 query blocks that skip masked keys:
  same output and gradients (q, k, v, bias) as float64 references, with packed segments,
  a dense mask, a bias and GQA."""
  b, t, n, k, h = 2, 512, 4, 2, 8
  assert (
    causal_blocks.causal_query_blocks(t, t, MaskInfo.create(jnp.ones((b, t)), causal=True)) == 4
  )
  q, kk, v = _qkv(b, t, t, n, k, h, seed=5)
  rng = np.random.default_rng(6)
  bias = rng.standard_normal((1, n, t, t)).astype(np.float32)
  cotangent = rng.standard_normal((b, t, n, h)).astype(np.float32)
  seg = np.ones((b, t), np.int32)
  seg[0, 200:] = 2  # a packed second example in row 0
  seg[1, 480:] = 0  # padding at the end of row 1
  dense = rng.random((b, 1, t, t)) > 0.1
  dense[..., np.arange(t), np.arange(t)] = True  # no fully masked row (see the docstring)
  info = MaskInfo.create(jnp.asarray(seg), causal=True)

  cotangent = cotangent * (seg > 0)[..., None, None]  # padding queries' outputs unused

  @jax.jit
  def run(q, k, v, bias):
    def loss(*args):
      out = dot_product_attention(*args[:3], mask=dense, mask_info=info, bias=args[3])
      return jnp.sum(out * cotangent), out

    return jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, bias)

  got, out = run(q, kk, v, bias)
  full_mask = ref.reference_mask(np.arange(t), np.arange(t), True, None, seg, seg) & dense
  expected = ref.attention(*(x.astype(np.float64) for x in (q, kk, v)), full_mask, bias)
  valid = seg > 0
  np.testing.assert_allclose(np.asarray(out)[valid], expected[valid], **TOL)
  tensors = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, kk, v, bias)]
  torch_out = _torch_attention(*tensors[:3], torch.tensor(full_mask), tensors[3])
  (torch_out * torch.tensor(cotangent, dtype=torch.float64)).sum().backward()
  for name, g, x in zip("qkvb", got, tensors, strict=True):
    np.testing.assert_allclose(g, x.grad.numpy(), rtol=1e-4, atol=2e-5, err_msg=f"d{name}")


def test_causal_query_blocks_dropout_is_unbiased_and_reproducible():
  """Dropout in the 2-block path: same key, same output; the mean over 400 keys is the
  output without dropout (inverted dropout), to within its sampling error."""
  t = 256
  q, k, v = (jnp.asarray(x) for x in _qkv(1, t, t, 1, 1, 4, seed=7))
  info = MaskInfo.create(jnp.ones((1, t), jnp.int32), causal=True)
  assert causal_blocks.causal_query_blocks(t, t, info) == 2

  def f(rng):
    return dot_product_attention(
      q, k, v, info, AttentionOptions(dropout_rate=0.5), dropout_rng=rng, deterministic=False
    )

  keys = jax.random.split(jax.random.PRNGKey(0), 400)
  outs = jax.jit(jax.vmap(f))(keys)  # [400, 1, T, 1, 4]
  clean = dot_product_attention(q, k, v, mask_info=info)
  single = jax.jit(f)
  np.testing.assert_array_equal(single(keys[0]), single(keys[0]))
  np.testing.assert_allclose(outs[0], single(keys[0]), **TOL)  # vmapped: same masks
  assert not np.allclose(outs[0], clean, **TOL)
  error = np.abs(np.asarray(outs.mean(0)) - np.asarray(clean))
  spread = np.asarray(outs.std(0)) / np.sqrt(len(keys))
  assert np.all(error <= 5 * spread + 1e-6), (error / (spread + 1e-12)).max()


@pytest.mark.parametrize(
  "t, s, causal, offset, window, expected",
  [
    (512, 512, True, 0, None, 4),
    (256, 256, True, 0, None, 2),
    (384, 384, True, 0, None, 3),
    (2048, 2048, True, 0, None, 4),
    (128, 128, True, 0, None, 1),  # too short to gain
    (256, 256, False, 0, None, 1),  # bidirectional
    (256, 256, True, 0, 64, 1),  # windowed
    (256, 512, True, 0, None, 1),  # not self-attention over the same length
    (256, 256, True, 3, None, 1),  # decoding at an offset
  ],
)
def test_causal_query_blocks_only_where_they_apply(t, s, causal, offset, window, expected):
  info = MaskInfo.create(jnp.ones((1, t)), causal=causal, window=window).replace(q_offset=offset)
  assert causal_blocks.causal_query_blocks(t, s, info) == expected
  assert causal_blocks.causal_query_blocks(t, s, None) == 1


def test_mask_helpers_match_reference():
  tokens = jnp.array([[5, 3, 0, 0], [1, 2, 3, 0]])
  np.testing.assert_array_equal(
    masks.padding_mask(tokens), (np.asarray(tokens) != 0)[:, None, None, :]
  )
  np.testing.assert_array_equal(
    masks.lengths_mask(jnp.array([2, 3]), 4), masks.padding_mask(tokens)
  )
  idx = np.arange(6)
  np.testing.assert_array_equal(
    masks.causal_mask(4, 6, offset=2), ref.reference_mask(2 + idx[:4], idx, causal=True)
  )
  np.testing.assert_array_equal(
    masks.sliding_window_mask(6, 2), ref.reference_mask(idx, idx, causal=True, window=2)
  )
  np.testing.assert_array_equal(
    masks.sliding_window_mask(6, 2, causal=False), ref.reference_mask(idx, idx, window=2)
  )
  seg = np.array([[1, 1, 2, 0, 0, 0]])
  np.testing.assert_array_equal(
    masks.segment_mask(jnp.asarray(seg), jnp.asarray(seg)),
    ref.reference_mask(idx, idx, q_segments=seg, kv_segments=seg),
  )
  combined = masks.combine_masks(
    None, masks.causal_mask(6), masks.sliding_window_mask(6, 3, causal=False)
  )
  np.testing.assert_array_equal(combined, ref.reference_mask(idx, idx, True, 3))
  assert masks.combine_masks(None, None) is None


def test_mask_info_blocks_tile_the_full_mask():
  seg = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  info = MaskInfo.create(seg, causal=True, window=3)

  @jax.jit
  def blocks(info):
    full = info.block_mask()
    return full, [[info.block_mask(i, 3, j, 2) for j in (0, 2, 4)] for i in (0, 3)]

  full, tiles = blocks(info)
  idx = np.arange(7)
  np.testing.assert_array_equal(
    full, ref.reference_mask(idx, idx, True, 3, np.asarray(seg), np.asarray(seg))
  )
  for bi, i in enumerate((0, 3)):
    for bj, j in enumerate((0, 2, 4)):
      np.testing.assert_array_equal(tiles[bi][bj], np.asarray(full)[..., i : i + 3, j : j + 2])
  no_mask = MaskInfo.create(jnp.ones((2, 5), jnp.int32)).replace(q_segment_ids=None)
  assert no_mask.block_mask() is None


def test_dot_product_attention_rejects_bad_arguments():
  q, k, v = (jnp.zeros((1, 2, 4, 8)), jnp.zeros((1, 2, 3, 8)), jnp.zeros((1, 2, 3, 8)))
  with pytest.raises(ValueError, match="multiple of kv heads"):
    dot_product_attention(q, k, v)
  with pytest.raises(ValueError, match="unknown attention impl"):
    dot_product_attention(q, q, q, options=AttentionOptions(impl="flash"))
  with pytest.raises(ValueError, match="dropout_rng"):
    dot_product_attention(q, q, q, options=AttentionOptions(dropout_rate=0.5), deterministic=False)


def test_attention_dropout_is_reproducible_and_off_when_deterministic():
  q, k, v = _qkv(1, 4, 4, 2, 2, 4)

  @jax.jit
  def run(rng):
    kw = dict(options=AttentionOptions(dropout_rate=0.5), dropout_rng=rng)
    off = dot_product_attention(q, k, v, deterministic=True, **kw)
    on, weights = dot_product_attention(q, k, v, deterministic=False, return_weights=True, **kw)
    return off, on, weights

  off, on, weights = run(jax.random.key(0))
  off2, on2, _ = run(jax.random.key(0))
  expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)))
  np.testing.assert_allclose(off, expected, **TOL)  # deterministic: dropout ignored
  np.testing.assert_array_equal(on, on2)  # same rng, same mask
  assert not np.allclose(on, off)
  np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)  # pre-dropout


# ----------------------------------------------------------------------------------------
# MultiHeadAttention.


def _mha_inputs(b=2, t=7, s=9, d=32, seed=0):
  rng = np.random.default_rng(seed)
  return (
    rng.standard_normal((b, t, d)).astype(np.float32),
    rng.standard_normal((b, s, d)).astype(np.float32),
  )


@pytest.mark.parametrize(
  "num_kv_heads, cross, impl",
  [(None, False, "xla"), (2, False, "chunked"), (1, True, "jax"), (2, True, "chunked")],
  ids=["mha-self", "gqa-self-chunked", "mqa-cross-jax", "gqa-cross-chunked"],
)
def test_multi_head_attention_matches_reference(
  tiny_config, random_params, jit_apply, num_kv_heads, cross, impl
):
  c = tiny_config(
    position="none", num_kv_heads=num_kv_heads, attention_impl=impl, attention_chunk_size=4
  )
  x, src = _mha_inputs()
  b, t, s = x.shape[0], x.shape[1], src.shape[1]
  q_idx, kv_idx = np.arange(t), np.arange(s)
  if cross:  # decoder queries over a padded source
    src_seg = np.ones((b, s), np.int32)
    src_seg[0, 6:] = 0
    info = MaskInfo.create(jnp.ones((b, t), jnp.int32), jnp.asarray(src_seg))
    ref_mask = ref.reference_mask(q_idx, kv_idx, q_segments=np.ones((b, t)), kv_segments=src_seg)
    kv_input = src
  else:  # packed causal self-attention
    seg = np.array([[1, 1, 1, 1, 2, 2, 2], [1] * 7], np.int32)
    info = MaskInfo.create(jnp.asarray(seg), causal=True)
    ref_mask = ref.reference_mask(q_idx, q_idx, True, None, seg, seg)
    kv_input, s, kv_idx = None, t, q_idx
  module = MultiHeadAttention(c, is_cross=cross)
  params = random_params(module, x, kv_input, info)
  out = jit_apply(module)(params, x, kv_input, info)
  positions = np.broadcast_to(np.arange(t), (b, t))
  kv_positions = np.broadcast_to(np.arange(s), (b, s))
  expected = ref.multi_head_attention(
    ref.to_numpy(params),
    x.astype(np.float64),
    None if kv_input is None else src.astype(np.float64),
    c,
    ref_mask,
    positions,
    kv_positions,
    not cross,
    is_cross=cross,
  )
  assert out.shape == x.shape
  np.testing.assert_allclose(out, expected, **TOL)


def test_padded_keys_get_zero_weight_and_their_content_changes_nothing(tiny_config, random_params):
  c = tiny_config(position="none", num_kv_heads=2)
  x, _ = _mha_inputs()
  seg = np.ones(x.shape[:2], np.int32)
  seg[0, 4:] = 0  # row 0: last three slots are padding
  seg[1, 6:] = 0
  info = MaskInfo.create(jnp.asarray(seg))
  module = MultiHeadAttention(c)
  params = random_params(module, x, None, info)

  @jax.jit
  def run(params, x):
    out, state = module.apply(
      {"params": params}, x, None, info, return_weights=True, mutable=["intermediates"]
    )
    return out, state["intermediates"]["attention_weights"][0]

  out, weights = run(params, x)
  x2 = x.copy()
  x2[0, 4:] = 100.0 * np.random.default_rng(9).standard_normal(x2[0, 4:].shape)
  x2[1, 6:] = -3.0
  out2, _ = run(params, x2)
  real = seg[:, :, None] > 0  # [B, T, 1] real query rows
  key_is_pad = (seg == 0)[:, None, None, :]  # [B, 1, 1, S]
  w = np.asarray(weights)  # [B, N, T, S]
  assert w.shape == (2, c.num_heads, 7, 7)
  assert np.all(np.where(key_is_pad & real[:, None], w, 0.0) == 0.0)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(np.where(real, out, 0), np.where(real, out2, 0))


def test_gqa_equals_mha_with_repeated_kv_heads(tiny_config, random_params):
  """K = N equals the default (None); GQA equals MHA whose kv heads are repeated per group."""
  x, _ = _mha_inputs(seed=5)
  info = MaskInfo.create(jnp.ones(x.shape[:2], jnp.int32), causal=True)
  gqa = MultiHeadAttention(tiny_config(position="none", num_kv_heads=2))
  mha = MultiHeadAttention(tiny_config(position="none"))
  mha_explicit = MultiHeadAttention(tiny_config(position="none", num_kv_heads=4))
  p_gqa = random_params(gqa, x, None, info)
  p_mha = random_params(mha, x, None, info)
  assert jax.tree.map(np.shape, p_mha) == jax.tree.map(
    np.shape, random_params(mha_explicit, x, None, info)
  )
  # Head n of the MHA reads kv head n // 2 of the GQA: repeat each kv head twice.
  repeated = {name: dict(p_gqa[name]) for name in p_gqa}
  for name in ("key", "value"):
    repeated[name]["kernel"] = np.repeat(p_gqa[name]["kernel"], 2, axis=1)  # [D, N, H]
    repeated[name]["bias"] = np.repeat(p_gqa[name]["bias"], 2, axis=0)  # [N, H]

  @jax.jit
  def run(p_gqa, repeated, p_mha):
    return (
      gqa.apply({"params": p_gqa}, x, None, info),
      mha.apply({"params": repeated}, x, None, info),
      mha.apply({"params": p_mha}, x, None, info),
      mha_explicit.apply({"params": p_mha}, x, None, info),
    )

  out_gqa, out_repeated, out_mha, out_explicit = run(p_gqa, repeated, p_mha)
  np.testing.assert_allclose(out_gqa, out_repeated, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out_mha, out_explicit, rtol=1e-6, atol=1e-6)


def _temp_bytes(impl, t, grad):
  b, n, h = 1, 2, 16
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.float32)
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  info = MaskInfo(pos, pos, causal=True)

  def f(q, k, v):
    return dot_product_attention(q, k, v, info, AttentionOptions(impl, chunk_size=128)).sum()

  f = jax.grad(f, argnums=(0, 1, 2)) if grad else f
  return jax.jit(f).lower(q, q, q).compile().memory_analysis().temp_size_in_bytes


def test_chunked_memory_grows_linearly_with_length():
  """Compiled temp memory: chunked grows ~2x per doubling (xla: ~4x, the measure works)."""
  for grad in (False, True):
    small, large = _temp_bytes("chunked", 1024, grad), _temp_bytes("chunked", 2048, grad)
    assert large < 2.3 * small, (grad, small, large)
  small, large = _temp_bytes("xla", 512, False), _temp_bytes("xla", 1024, False)
  assert large > 3.5 * small, (small, large)
