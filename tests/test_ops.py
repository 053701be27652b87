"""The kernels of `transformer.ops` against the plain library ops they replace.

Dropout masks are bit-identical to flax's / `jax.random.bernoulli`'s: the same Threefry
program by construction. The dense layers (a 2-D matmul with a custom backward, against
`nn.Dense`'s `dot_general`) and the causal query blocks compute the same sums as other
programs, which XLA:CPU emits differently per instruction set (bit-identical forwards on an
AVX-512 CPU, not on AVX2 or SSE4.2), so outputs and gradients agree to float32 rounding:
1e-6 relative to the largest value of the model, not bit for bit.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from transformer.nn.config import ModelConfig
from transformer.nn.masks import MaskInfo
from transformer.nn.models import build_model
from transformer.ops import OPS, causal_blocks, dense, dropout, select

TOL = dict(rtol=1e-5, atol=1e-5)


def _x(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 8), (4, 2, 33, 17)])
@pytest.mark.parametrize("p", [0.9, 0.5, 0.123])
def test_bernoulli_is_jax_random_bernoulli_bit_for_bit(shape, p):
  for key in (jax.random.key(7), jax.random.PRNGKey(7), jax.random.fold_in(jax.random.key(3), 11)):
    want = jax.random.bernoulli(key, p, shape)
    got = jax.jit(dropout.bernoulli, static_argnums=(1, 2))(key, p, shape)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bernoulli_falls_back_for_other_key_impls():
  key = jax.random.key(0, impl="rbg")
  want = jax.random.bernoulli(key, 0.3, (4, 6))
  np.testing.assert_array_equal(dropout.bernoulli(key, 0.3, (4, 6)), want)


@pytest.mark.parametrize("rate, broadcast_dims", [(0.1, ()), (0.5, (1,)), (0.3, (-1,))])
def test_dropout_equals_flax_dropout(rate, broadcast_dims):
  x = jnp.asarray(_x((3, 9, 16)))
  rngs = {"dropout": jax.random.key(5)}
  want = nn.Dropout(rate, broadcast_dims=broadcast_dims).apply(
    {}, x, deterministic=False, rngs=rngs
  )
  ours = dropout.Dropout(rate, broadcast_dims=broadcast_dims)
  np.testing.assert_array_equal(ours.apply({}, x, deterministic=False, rngs=rngs), want)
  np.testing.assert_array_equal(ours.apply({}, x, deterministic=True), x)


@pytest.mark.parametrize(
  "x_shape, w_shape, contract",
  [((2, 3, 5), (5, 7), 1), ((2, 3, 4, 5), (4, 5, 6), 2), ((2, 3, 8), (8, 2, 4), 1)],
  ids=["dense", "out-projection", "head-projection"],
)
def test_dense_dot_general_matches_lax_dot_general_and_its_gradients(x_shape, w_shape, contract):
  rng = np.random.default_rng(0)
  x, w = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in (x_shape, w_shape))
  dims = ((tuple(range(len(x_shape) - contract, len(x_shape))), tuple(range(contract))), ((), ()))
  g = jnp.asarray(rng.standard_normal(jax.eval_shape(lambda: lax.dot_general(x, w, dims)).shape))

  def loss(dot, x, w):
    return jnp.sum(dot(x, w, dims) * g)

  np.testing.assert_allclose(
    dense.dense_dot_general(x, w, dims), lax.dot_general(x, w, dims), **TOL
  )
  want = jax.grad(functools.partial(loss, lax.dot_general), argnums=(0, 1))(x, w)
  got = jax.grad(functools.partial(loss, dense.dense_dot_general), argnums=(0, 1))(x, w)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, **TOL)


def test_dense_dot_general_leaves_batched_contractions_to_lax():
  x, w = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  dims = (((2,), (1,)), ((0,), (0,)))
  np.testing.assert_array_equal(dense.dense_dot_general(x, w, dims), lax.dot_general(x, w, dims))


def test_select_names_the_kernels():
  assert set(OPS) == {"fast", "plain"}
  assert select("fast").dot_general is dense.dense_dot_general
  assert select("plain").dropout is nn.Dropout
  assert select("plain").causal_query_blocks(512, 512, None) == 1
  with pytest.raises(ValueError, match="unknown ops 'cuda'"):
    select("cuda")


BASE = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, max_len=256, dropout_rate=0.1)
TOKENS = np.random.default_rng(0).integers(1, 50, (2, 256)).astype(np.int32)
FAMILIES = {
  # T = 256: the fast path splits causal self-attention into 2 query blocks.
  "decoder-untied-causal-blocks": (dict(family="decoder", tie_embeddings=False), (TOKENS,)),
  "mlm-untied-attention-dropout": (
    dict(family="encoder", tie_embeddings=False, attention_dropout_rate=0.1),
    (TOKENS[:, :32],),
  ),
  "classifier": (dict(family="encoder", num_classes=3), (TOKENS[:, :32],)),
  "seq2seq-untied": (
    dict(family="seq2seq", tie_embeddings=False),
    (TOKENS[:, :32], TOKENS[:, 32:64]),
  ),
  "vit": (
    dict(family="vit", num_classes=5, image_size=32, patch_size=8, max_len=17),
    (_x((2, 32, 32, 3)),),
  ),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fast_and_plain_ops_train_the_same_model(name):
  """Same dropout masks, same sums: outputs and gradients agree to float32 rounding."""
  overrides, args = FAMILIES[name]
  results = {}
  for ops in OPS:
    model = build_model(ModelConfig(**{**BASE, **overrides, "ops": ops}))
    params = jax.jit(model.init)(jax.random.key(0), *args)["params"]  # one program, not op by op

    def loss(p, model=model):
      rngs = {"dropout": jax.random.key(1)}
      y = model.apply({"params": p}, *args, deterministic=False, rngs=rngs)
      return jnp.sum(jnp.sin(y)), y

    results[ops] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  (_, y_fast), g_fast = results["fast"]
  (_, y_plain), g_plain = results["plain"]
  assert jax.tree.structure(g_fast) == jax.tree.structure(g_plain)
  if name.endswith("causal-blocks"):
    assert (
      causal_blocks.causal_query_blocks(256, 256, MaskInfo.create(jnp.ones((1, 256)), causal=True))
      == 2
    )
  # Rounding of a sum computed by another program scales with its terms, not with its
  # (possibly cancelling) result, so the absolute tolerance is relative to the largest value:
  # a few float32 ulps (1.2e-7) of it. Measured: outputs differ by at most 2.8e-7 of the
  # largest output under --xla_cpu_max_isa=AVX2 or SSE4_2 (3.5e-7 on an AVX2-only CPU),
  # gradients by 2.1e-7 of the largest gradient; an AVX-512 CPU gives identical outputs.
  y_scale = float(np.abs(y_plain).max())
  np.testing.assert_allclose(y_fast, y_plain, rtol=1e-6, atol=1e-6 * y_scale)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(g_plain))
  for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_plain), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * scale)


def test_causal_blocks_survive_a_traced_query_offset():
  """`nn.remat` traces MaskInfo's q_offset of a full pass; T == S still means offset 0."""
  info = MaskInfo.create(jnp.ones((1, 256)), causal=True)
  seen = []

  @jax.jit
  def blocks(offset):
    seen.append(causal_blocks.causal_query_blocks(256, 256, info.replace(q_offset=offset)))
    seen.append(causal_blocks.causal_query_blocks(1, 256, info.replace(q_offset=offset)))
    return offset

  blocks(jnp.int32(0))
  assert seen == [2, 1]  # a decoding step (T < S) never splits
  assert causal_blocks.causal_query_blocks(256, 256, info.replace(q_offset=3)) == 1
