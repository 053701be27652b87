"""No position information: the model sees a bag of tokens (order only through causality)."""

from __future__ import annotations

from transformer.nn.positions.base import Position


class NoPosition(Position):
  """Every hook keeps its default: nothing is added, rotated or biased."""
