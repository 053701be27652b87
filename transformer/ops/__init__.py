"""Backend-specific kernels behind one switch, `ModelConfig.ops`.

  'fast'   (default) dropout masks from an unrolled Threefry-2x32 (`dropout.bernoulli`,
           `dropout.Dropout`), dense layers whose backward pass is two 2-D matmuls
           (`dense.dense_dot_general`), and causal self-attention by query blocks that skip
           masked keys (`causal_blocks`). Built for XLA:CPU; correct on every backend.
  'plain'  the library ops: `flax.linen.Dropout` / `jax.random.bernoulli`,
           `jax.lax.dot_general`, one attention product over all keys.

Both give the same dropout masks bit for bit; dense layers and causal attention agree up
to the order of floating-point sums (tests/test_layers.py, tests/test_attention.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from jax import lax

from transformer.ops import causal_blocks, dense, dropout


@dataclasses.dataclass(frozen=True)
class Ops:
  """One set of kernels: what the model code calls where a backend trick may apply."""

  bernoulli: Callable[[jax.Array, float, tuple[int, ...]], jax.Array]  # bool keep masks
  dropout: type[nn.Dropout]  # the dropout module (same masks and names as flax's)
  dot_general: Callable[..., jax.Array]  # the dense layers' contraction
  causal_query_blocks: Callable[[int, int, Any], int]  # query blocks of causal attention


OPS: dict[str, Ops] = {
  "fast": Ops(
    bernoulli=dropout.bernoulli,
    dropout=dropout.Dropout,
    dot_general=dense.dense_dot_general,
    causal_query_blocks=causal_blocks.causal_query_blocks,
  ),
  "plain": Ops(
    bernoulli=jax.random.bernoulli,
    dropout=nn.Dropout,
    dot_general=lax.dot_general,
    causal_query_blocks=causal_blocks.no_query_blocks,
  ),
}


def select(name: str) -> Ops:
  """The kernels named `name` ('fast' or 'plain')."""
  if name not in OPS:
    raise ValueError(f"unknown ops {name!r}; expected {' or '.join(OPS)}")
  return OPS[name]
