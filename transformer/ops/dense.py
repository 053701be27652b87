"""The dense layers' contraction with a backward pass of two 2-D matmuls (fast on XLA:CPU)."""

from __future__ import annotations

import functools
import math

import jax
from jax import lax


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


def dense_dot_general(
  lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None, preferred_element_type=None
) -> jax.Array:
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
