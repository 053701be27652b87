"""Position biases (ALiBi, T5, Shaw) built block by block by the chunked attention.

The chunked path calls the position's `BlockBias` per (query block, key block); the 'xla'
path (the reference, itself checked against float64 NumPy) builds the same function
whole. Both must agree in values and gradients (through the T5 table and the Shaw
embeddings too), with cached decoding, and the chunked memory must stay linear in length.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import reference_self_attention

from transformer.nn.attention import MultiHeadAttention
from transformer.nn.config import ModelConfig
from transformer.nn.kernel_rules import AttentionOptions
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import BlockBias, MaskInfo
from transformer.nn.models import DecoderLM
from transformer.nn.positions import position_for

TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=2e-5)

# Each case: position, causal, window, kv heads. T = 11 with chunk 4: a partial last block.
CASES = {
  "alibi-bidirectional-gqa": ("alibi", False, None, 2),
  "t5-bidirectional-padding": ("relative_t5", False, None, None),
  "t5-causal-window": ("relative_t5", True, 4, None),
  "shaw-causal-gqa": ("relative_shaw", True, None, 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_chunked_position_bias_equals_xla_in_values_and_gradients(tiny_config, random_params, name):
  position, causal, window, kv_heads = CASES[name]
  b, t = 2, 11
  configs = {
    impl: tiny_config(
      position=position, num_kv_heads=kv_heads, attention_impl=impl, attention_chunk_size=4
    )
    for impl in ("xla", "chunked")
  }
  c = configs["xla"]
  rng = np.random.default_rng(0)
  x = rng.standard_normal((b, t, c.d_model)).astype(np.float32)
  cotangent = rng.standard_normal((b, t, c.d_model)).astype(np.float32)
  # Row 0 packs two sequences (positions restart); row 1 ends in padding (segment 0).
  seg = np.array([[1] * 5 + [2] * 6, [1] * 8 + [0] * 3], np.int32)
  positions = np.array([list(range(5)) + list(range(6)), list(range(11))], np.int32)
  info = MaskInfo.create(
    jnp.asarray(seg), q_positions=jnp.asarray(positions), causal=causal, window=window
  )
  table = None
  if position == "relative_t5":
    table = (0.5 * rng.standard_normal((c.relative_num_buckets, c.num_heads))).astype(np.float32)
  modules = {impl: MultiHeadAttention(cfg) for impl, cfg in configs.items()}
  params = random_params(modules["xla"], x, None, info, table)

  @jax.jit
  def run(params, x, table):
    def loss(impl, params, x, table):
      out = modules[impl].apply({"params": params}, x, None, info, table)
      return jnp.sum(out * cotangent), out

    return {
      impl: jax.grad(lambda *a, impl=impl: loss(impl, *a), argnums=(0, 1, 2), has_aux=True)(
        params, x, table
      )
      for impl in modules
    }

  got = run(params, x, table)
  (grads_xla, out_xla), (grads_chunked, out_chunked) = got["xla"], got["chunked"]
  expected = reference_self_attention(params, x, c, seg, positions, causal, window, table)
  np.testing.assert_allclose(out_xla, expected, **TOL)
  np.testing.assert_allclose(out_chunked, out_xla, **TOL)
  flat_xla = jax.tree_util.tree_flatten_with_path(grads_xla)[0]  # params, x (, T5 table)
  flat_chunked = jax.tree_util.tree_leaves(grads_chunked)
  names = [jax.tree_util.keystr(path) for path, _ in flat_xla]
  assert (
    len(flat_chunked)
    == len(names)
    == len(jax.tree_util.tree_leaves(params)) + 1 + (table is not None)
  )
  assert position != "relative_shaw" or any("rel_key_embedding" in n for n in names)
  for name, (_, g_xla), g_chunked in zip(names, flat_xla, flat_chunked, strict=True):
    assert np.abs(np.asarray(g_xla)).max() > 0, name  # every gradient is exercised
    np.testing.assert_allclose(g_chunked, g_xla, **GRAD_TOL, err_msg=name)


@pytest.mark.parametrize("position", ["relative_t5", "relative_shaw"])
def test_cached_decoding_with_relative_bias_equals_the_chunked_and_xla_forward(
  tiny_config, random_params, position
):
  """Prefill 4 tokens, then one at a time over the cache: the bias comes from the cache
  positions. The logits equal the full forward pass, chunked (chunk 3) and 'xla'."""
  c = tiny_config(position=position, num_layers=1, attention_impl="chunked", attention_chunk_size=3)
  model, reference = DecoderLM(c), DecoderLM(c.replace(attention_impl="xla"))
  b, total, prefill = 2, 9, 4
  tokens = np.random.default_rng(1).integers(1, c.vocab_size, (b, total)).astype(np.int32)
  positions = np.broadcast_to(np.arange(total, dtype=np.int32), (b, total))
  params = random_params(model, tokens)
  init = jax.jit(
    lambda: model.init(jax.random.key(0), np.zeros((b, c.max_len), np.int32), decode=True)["cache"]
  )

  @jax.jit
  def step(params, cache, tokens, positions):
    return model.apply(
      {"params": params, "cache": cache}, tokens, positions, decode=True, mutable=["cache"]
    )

  logits, state = step(params, init(), tokens[:, :prefill], positions[:, :prefill])
  pieces = [logits]
  for i in range(prefill, total):
    logits, state = step(params, state["cache"], tokens[:, i : i + 1], positions[:, i : i + 1])
    pieces.append(logits)
  full = jax.jit(lambda p: [m.apply({"params": p}, tokens) for m in (model, reference)])(
    params
  )  # chunked, xla
  np.testing.assert_allclose(full[0], full[1], **TOL)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full[1], **TOL)


class _PositionBias(nn.Module):
  """The `bias` hook of one position kind, as `MultiHeadAttention` calls it."""

  config: ModelConfig

  @nn.compact
  def __call__(self, info, table):
    return position_for(self.config).bias(self, info, table)


def _temp_bytes(position, impl, t, grad):
  """Compiled temp memory of attention with `position`'s bias (and of its gradients with
  respect to q, k, v and the bias parameters when `grad`)."""
  b, n, h, buckets = 1, 2, 16, 32
  c = ModelConfig(
    vocab_size=8, d_model=n * h, num_heads=n, num_layers=1, d_ff=8, max_len=t, position=position
  )
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  info = MaskInfo(pos, pos, causal=True)
  module = _PositionBias(c)
  table = jnp.zeros((buckets, n)) if position == "relative_t5" else None
  params = module.init(jax.random.key(0), info, table).get("params", {})

  def f(q, k, v, params, table):
    bias = module.apply({"params": params}, info, table)
    out = dot_product_attention(q, k, v, info, AttentionOptions(impl, chunk_size=128), bias=bias)
    return out.sum()

  f = jax.grad(f, argnums=(0, 1, 2, 3, 4)) if grad else f
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.float32)
  compiled = jax.jit(f).lower(q, q, q, params, table).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("position", ["alibi", "relative_t5", "relative_shaw"])
def test_chunked_memory_with_position_bias_grows_linearly_with_length(position):
  """Compiled temp memory of chunked attention with the bias: < 2.3x per doubling of the
  length, forward and forward + backward (a dense [T, S] bias would be ~4x)."""
  for grad in (False, True):
    small = _temp_bytes(position, "chunked", 1024, grad)
    large = _temp_bytes(position, "chunked", 2048, grad)
    assert large < 2.3 * small, (position, grad, small, large)


def test_xla_memory_with_position_bias_is_quadratic():
  """The measure sees a dense bias: 'xla' with the T5 bias grows > 3.5x per doubling."""
  small, large = (
    _temp_bytes("relative_t5", "xla", 512, False),
    _temp_bytes("relative_t5", "xla", 1024, False),
  )
  assert large > 3.5 * small, (small, large)


def test_block_bias_without_mask_info_is_refused():
  q = jnp.zeros((1, 3, 2, 4))
  bias = BlockBias(lambda params, q, qp, kp: jnp.zeros((1, 2, qp.shape[1], kp.shape[1])))
  for impl in ("xla", "chunked"):
    with pytest.raises(ValueError, match="BlockBias needs mask_info"):
      dot_product_attention(q, q, q, options=AttentionOptions(impl), bias=bias)
