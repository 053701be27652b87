"""Position encodings: one file per kind behind the `Position` hooks, one registry.

`POSITIONS` maps `ModelConfig.position` to its kind; `position_for(config)` gives the
instance the model calls. A new kind is one file here and one entry below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformer.nn.positions.alibi import Alibi, alibi_bias, alibi_slopes
from transformer.nn.positions.base import Position
from transformer.nn.positions.learned import Learned, LearnedPositionEmbedding
from transformer.nn.positions.none import NoPosition
from transformer.nn.positions.relative_shaw import RelativeShaw, shaw_relative_logits
from transformer.nn.positions.relative_t5 import RelativeT5, t5_relative_bias, t5_relative_bucket
from transformer.nn.positions.rope import Rope, apply_rope, rope_frequencies
from transformer.nn.positions.sinusoidal import Sinusoidal, sincos_2d_table, sinusoidal_table

if TYPE_CHECKING:
  from transformer.nn.config import ModelConfig

POSITIONS: dict[str, type[Position]] = {
  "sinusoidal": Sinusoidal,
  "learned": Learned,
  "rope": Rope,
  "alibi": Alibi,
  "relative_t5": RelativeT5,
  "relative_shaw": RelativeShaw,
  "none": NoPosition,
}


def position_for(config: ModelConfig) -> Position:
  """The position encoding `config.position` names."""
  return POSITIONS[config.position](config)


__all__ = [
  "POSITIONS",
  "LearnedPositionEmbedding",
  "Position",
  "alibi_bias",
  "alibi_slopes",
  "apply_rope",
  "position_for",
  "rope_frequencies",
  "shaw_relative_logits",
  "sincos_2d_table",
  "sinusoidal_table",
  "t5_relative_bias",
  "t5_relative_bucket",
]
