"""Norms, the feed-forward block and token embeddings.

Letters: B batch, T length, D model dim, F feed-forward hidden dim, V vocabulary.
Parameters are float32; computation runs in `config.dtype` (norm statistics in float32).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer.nn.config import ModelConfig
from transformer.nn.positional import AbsolutePositionEmbedding

DENSE_INIT = nn.initializers.xavier_uniform()


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array):
  """Threefry-2x32, 20 rounds (Salmon et al. 2011), unrolled: XLA fuses it into one loop.

  The same function as JAX's `threefry2x32` primitive, whose CPU lowering runs the rounds
  as a while loop that writes every intermediate array to memory.
  """
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in _THREEFRY_ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
    x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def bernoulli(key: jax.Array, p: float, shape: tuple[int, ...]) -> jax.Array:
  """`jax.random.bernoulli(key, p, shape)`, bit for bit, as one fused elementwise loop.

  For threefry keys with `jax_threefry_partitionable` (the default) the bits are
  threefry(key, counter) over the flat index, as in JAX; `uniform < p` is the exact
  integer test `bits >> 9 < ceil(float32(p) * 2**23)`. Any other key or setting falls
  back to `jax.random.bernoulli`. Returns bool `shape`.
  """
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  wrapped = key if typed else jax.random.wrap_key_data(key)
  size = math.prod(shape)
  if (
    str(jax.random.key_impl(wrapped)) != "threefry2x32"
    or not jax.config.jax_threefry_partitionable
    or size >= 2**32
  ):
    return jax.random.bernoulli(key, p, shape)
  k = jax.random.key_data(wrapped)  # uint32 [2]
  counter = lax.iota(jnp.uint32, size).reshape(shape)
  b0, b1 = _threefry2x32(k[0], k[1], jnp.zeros(shape, jnp.uint32), counter)
  threshold = np.uint32(math.ceil(float(np.float32(p)) * 2**23))
  return ((b0 ^ b1) >> np.uint32(9)) < threshold


class Dropout(nn.Dropout):
  """`flax.linen.Dropout` with identical masks and names, drawn by `bernoulli` (fast on CPU)."""

  @nn.compact
  def __call__(self, inputs, deterministic: bool | None = None, rng=None):
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    rng = self.make_rng(self.rng_collection) if rng is None else rng
    shape = list(inputs.shape)
    for dim in self.broadcast_dims:
      shape[dim] = 1
    mask = jnp.broadcast_to(bernoulli(rng, keep_prob, tuple(shape)), inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, contracting: int) -> jax.Array:
  k = math.prod(w.shape[:contracting])
  y = x.reshape(-1, k) @ w.reshape(k, -1)  # [M, N]
  return y.reshape(*x.shape[: x.ndim - contracting], *w.shape[contracting:])


def _matmul_fwd(x, w, contracting):
  return _matmul(x, w, contracting), (x, w)


def _matmul_bwd(contracting, residuals, g):
  x, w = residuals
  k = math.prod(w.shape[:contracting])
  x2, w2 = x.reshape(-1, k), w.reshape(k, -1)  # [M, K], [K, N]
  g2 = g.reshape(x2.shape[0], -1)  # [M, N]
  return (g2 @ w2.T).reshape(x.shape), (x2.T @ g2).reshape(w.shape)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """`lax.dot_general` for the dense layers, x[..., K...] . w[K..., N...], with the backward
  pass written as two 2-D matmuls: dx = g w^T, dw = x^T g.

  Same values as autodiff of `lax.dot_general`, whose weight gradient XLA:CPU otherwise
  lowers with both operands transposed (a slow GEMM plus a copy of g). Other dimension
  numbers, an explicit precision or output type go to `lax.dot_general` unchanged.
  """
  (lhs_contract, rhs_contract), batch = dimension_numbers
  n = len(lhs_contract)
  if (
    any(batch)
    or tuple(lhs_contract) != tuple(range(lhs.ndim - n, lhs.ndim))
    or tuple(rhs_contract) != tuple(range(n))
    or precision is not None
    or preferred_element_type is not None
  ):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)
  return _matmul(lhs, rhs, n)


def compute_dtype(config: ModelConfig) -> jnp.dtype:
  return jnp.dtype(config.dtype)


def make_norm(config: ModelConfig, name: str | None = None) -> nn.Module:
  """LayerNorm (scale and bias) or RMSNorm (scale only), statistics in float32."""
  if config.norm == "layernorm":
    return nn.LayerNorm(
      epsilon=config.norm_eps, dtype=compute_dtype(config), use_fast_variance=False, name=name
    )
  return nn.RMSNorm(epsilon=config.norm_eps, dtype=compute_dtype(config), name=name)


def make_dense(config: ModelConfig, features: int, name: str) -> nn.Dense:
  return nn.Dense(
    features,
    use_bias=config.use_bias,
    dtype=compute_dtype(config),
    kernel_init=DENSE_INIT,
    dot_general=dense_dot_general,
    name=name,
  )


ACTIVATIONS = {
  "relu": nn.relu,
  "gelu": lambda x: nn.gelu(x, approximate=False),
  "swiglu": nn.silu,  # gate activation of SwiGLU (Shazeer 2020)
  "geglu": lambda x: nn.gelu(x, approximate=False),  # gate activation of GeGLU
}


class FeedForward(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_0 x) * wi_1 x) for GLU variants.

  Hidden-size convention: `config.d_ff` is the hidden width F actually used. A gated unit
  has three D x F matrices instead of two, so to match a 4*D two-matrix FFN's parameters
  set F = 2/3 * 4 * D (`config.gated_hidden_size`, the 2/3 rule of Shazeer 2020 / LLaMA).
  Dropout on the hidden activations uses `config.dropout_rate`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    c = self.config
    act = ACTIVATIONS[c.activation]
    if c.gated:
      h = act(make_dense(c, c.d_ff, "wi_0")(x)) * make_dense(c, c.d_ff, "wi_1")(x)  # [B, T, F]
    else:
      h = act(make_dense(c, c.d_ff, "wi")(x))  # [B, T, F]
    h = Dropout(c.dropout_rate)(h, deterministic=deterministic)
    return make_dense(c, c.d_model, "wo")(h)  # [B, T, D]


def make_embed(config: ModelConfig, num_embeddings: int, name: str) -> nn.Embed:
  """Token embedding table [V, D], init normal(D**-0.5); `.attend(x)` gives x @ E^T logits."""
  return nn.Embed(
    num_embeddings,
    config.d_model,
    embedding_init=nn.initializers.normal(stddev=config.d_model**-0.5),
    dtype=compute_dtype(config),
    name=name,
  )


class Embedder(nn.Module):
  """Token embedding (* sqrt(D) if configured) + absolute positions, then dropout.

  `embed` is the token table, owned by the model so that inputs, targets and output
  logits can share it. tokens, positions: [B, T] ints -> [B, T, D].
  """

  config: ModelConfig
  embed: nn.Module
  dropout: bool = True  # False: the caller applies dropout after adding more embeddings

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    c = self.config
    x = self.embed(tokens)  # [B, T, D]
    if c.scale_embeddings:
      x = x * jnp.asarray(c.d_model**0.5, x.dtype)
    if c.position in ("learned", "sinusoidal"):
      x = AbsolutePositionEmbedding(c.max_len, c.position, name="positions")(x, positions)
    if self.dropout:
      x = Dropout(c.dropout_rate)(x, deterministic=deterministic)
    return x


def default_positions(tokens: jax.Array) -> jax.Array:
  """Positions 0..T-1 for every row: [B, T] -> int32 [B, T]."""
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
