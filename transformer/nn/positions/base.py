"""The interface every position encoding implements; each hook defaults to "no effect".

Letters: B batch, T query length, S key length, N heads, H head dim, D model dim.

A kind acts through the hooks it overrides, called by the model at these points:

  embed(module, x, positions)      added to the token embeddings (inside `Embedder`)
  shared_table(module)             one table shared by every layer of a stack (`Stack`)
  rotate(x, positions)             rotates self-attention queries and keys (`MultiHeadAttention`)
  bias(module, info, table)        additive term on the self-attention logits, as a
                                   `masks.BlockBias`: a function of the queries and the
                                   positions of a (query block, key block), so the chunked
                                   attention builds it per block and the others whole

`module` is the calling Flax module: parameters a hook creates live in its scope, so their
paths are those of the calling layer. The counting hooks give the parameters each hook
creates, and `validate` the configuration rules of the kind.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax

if TYPE_CHECKING:
  from transformer.nn.config import ModelConfig
  from transformer.nn.masks import BlockBias, MaskInfo


@dataclasses.dataclass(frozen=True)
class Position:
  """A position encoding for `config` (see the module docstring for the hooks)."""

  config: ModelConfig

  def embed(self, module: nn.Module, x: jax.Array, positions: jax.Array) -> jax.Array:
    """Token embeddings x [B, T, D] at int positions [B, T] -> [B, T, D]."""
    del module, positions
    return x

  def shared_table(self, module: nn.Module) -> jax.Array | None:
    """The stack-wide table passed to every layer's `bias`, or None."""
    del module
    return None

  def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """Self-attention queries or keys x [B, T, N, H] at positions [B, T] -> [B, T, N, H]."""
    del positions
    return x

  def bias(self, module: nn.Module, info: MaskInfo, table: jax.Array | None) -> BlockBias | None:
    """The self-attention logit bias at the positions of `info` (float32 [B|1, N, T, S]
    when built whole), or None."""
    del module, info, table
    return None

  def validate(self) -> None:
    """Raises `ValueError` (via `config.fail`) when the config cannot use this kind."""

  def embedding_params(self) -> int:
    """Parameters `embed` creates in one embedder."""
    return 0

  def stack_params(self) -> int:
    """Parameters `shared_table` creates in one stack."""
    return 0

  def attention_params(self) -> int:
    """Parameters `bias` creates in one self-attention layer."""
    return 0
