"""Which parameters Muon orthogonalises, and how (`optimizer.py` composes the optimizer):
`MUON_MATRICES` names the modules whose kernels are matrices, with each kernel's rank and
input axes; `labels` splits a parameter tree into 'muon' and 'adam' leaves by path names
(never shapes, so `nn.scan`-stacked layers get the same labels, their leading axis a batch
axis); `dimension_numbers` gives optax's Muon each matrix's reduction and output axes;
`scale_by_shape` scales the orthogonalised update by the matrix's fans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax.core import meta
from optax import contrib

from transformer.nn import tree

MUON_MATRICES: dict[str, tuple[int, int]] = {  # module name -> (own rank, input axes)
  "query": (3, 1),  # [D, N, H]: D -> N*H
  "key": (3, 1),  # [D, K, H]
  "value": (3, 1),  # [D, K, H]
  "out": (3, 2),  # [N, H, D]: N*H -> D
  "wi": (2, 1),  # [D, F]
  "wi_0": (2, 1),
  "wi_1": (2, 1),
  "wo": (2, 1),  # [F, D]
  "mlm_transform": (2, 1),  # [D, D] (encoder MLM head's hidden layer)
  "pooler": (2, 1),  # [D, D] (classifier's hidden layer)
}


def _matrix_axes(names: tuple[str, ...], ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(input axes, output axes) of a Muon matrix parameter, or ((), ()) for AdamW's."""
  if len(names) < 2 or names[-1] != "kernel" or names[-2] not in MUON_MATRICES:
    return (), ()
  rank, inputs = MUON_MATRICES[names[-2]]
  batch = ndim - rank  # leading stacked axes (nn.scan layers)
  if batch < 0:
    return (), ()
  return tuple(range(batch, batch + inputs)), tuple(range(batch + inputs, ndim))


def _map_named(fn: Callable[[tuple[str, ...], Any], Any], params: Any) -> Any:
  """fn(path names, leaf) over a pytree; an `nn.Partitioned` box's value gets the box's."""

  def decide(path: tuple[Any, ...], leaf: Any) -> Any:
    names = tree.path_names(path)
    if isinstance(leaf, meta.AxisMetadata):
      return jax.tree.map(lambda x: fn(names, x), leaf)
    return fn(names, leaf)

  return jax.tree_util.tree_map_with_path(
    decide, params, is_leaf=lambda x: isinstance(x, meta.AxisMetadata)
  )


def labels(params: Any) -> Any:
  """'muon' for the hidden weight matrices (`MUON_MATRICES`), 'adam' for the rest."""
  return _map_named(lambda n, x: "muon" if _matrix_axes(n, x.ndim)[0] else "adam", params)


def dimension_numbers(updates: Any) -> Any:
  """`MuonDimensionNumbers` of the Muon leaves of `updates` (the Muon arm of the
  partition, whose other leaves are optax's empty `MaskedNode`s)."""

  def dims(names: tuple[str, ...], x: Any) -> contrib.MuonDimensionNumbers:
    inputs, outputs = _matrix_axes(names, x.ndim)
    return contrib.MuonDimensionNumbers(reduction_axis=inputs, output_axis=outputs)

  return _map_named(dims, updates)


def scale_by_shape(consistent_rms: float) -> optax.GradientTransformation:
  """The orthogonalised update times sqrt(max(1, fan_out / fan_in)) (consistent_rms 0) or
  consistent_rms * sqrt(max(fan_in, fan_out)); fans are products of the matrix's axes."""

  def scale(names: tuple[str, ...], u: jax.Array) -> jax.Array:
    inputs, outputs = _matrix_axes(names, u.ndim)
    fan_in = math.prod(u.shape[a] for a in inputs)
    fan_out = math.prod(u.shape[a] for a in outputs)
    if consistent_rms > 0:
      return u * (consistent_rms * math.sqrt(max(fan_in, fan_out)))
    return u * math.sqrt(max(1.0, fan_out / fan_in))

  def update(updates, state, params=None):
    del params
    return _map_named(scale, updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)
