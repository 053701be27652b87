"""Dropout masks as one fused elementwise loop: Threefry-2x32 unrolled for XLA:CPU.

`bernoulli` gives the bits of `jax.random.bernoulli` exactly, and `Dropout` the masks of
`flax.linen.Dropout` exactly; only the speed on CPU differs (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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
