"""The mesh block of an experiment: devices per mesh axis (`MeshConfig`), the logical-axis
rules a config overrides (`mesh_rules`), and the checks of both against the rest of the
config, run by `experiment.validate` before anything is built."""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer.data.config import fail
from transformer.nn.config import ModelConfig
from transformer.nn.partitioning import MESH_AXES
from transformer.train.typed_config import as_dict, check_type


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices per mesh axis (`nn/partitioning.py`)."""

  data: int = -1  # data-parallel ways (-1: all devices not used by the other axes)
  fsdp: int = 1  # ways parameters / optimizer state are sharded (and the batch split)
  tensor: int = 1  # tensor-parallel ways (heads, FFN hidden, vocabulary)
  expert: int = 1  # expert-parallel ways (mixture-of-experts weights; the batch is split too)
  context: int = 1  # context-parallel ways: the sequence split (model.context_attention)

  def __post_init__(self):
    sizes = dataclasses.asdict(self)
    for name, size in sizes.items():
      if size == 0 or size < -1:
        fail(f"mesh.{name}", size, "must be >= 1, or -1 for all remaining devices")
    if list(sizes.values()).count(-1) > 1:
      fail("mesh", sizes, "at most one axis may be -1")

  def shape(self) -> dict[str, int]:
    return dataclasses.asdict(self)


def check(mesh: MeshConfig, parallelism: str, model: ModelConfig) -> None:
  """The mesh against the loop's parallelism and the model: one line naming the field."""
  if parallelism == "pmap" and (mesh.fsdp, mesh.tensor, mesh.expert, mesh.context) != (1,) * 4:
    only = "is data parallelism only: use jit for fsdp / tensor / expert / context"
    fail("parallelism", "pmap", only)
  if mesh.context != 1 and model.attention_dropout_rate > 0.0:
    fail(
      "model.attention_dropout_rate",
      model.attention_dropout_rate,
      f"must be 0 with mesh.context={mesh.context}: context-parallel attention has no dropout",
    )


def rules(raw: Any) -> dict[str, tuple[str, ...]]:
  """`config.mesh_rules` (logical axis -> comma-separated mesh axes) as tuples, checked."""
  out = {}
  for logical, value in as_dict(raw).items():
    check_type(f"mesh_rules.{logical}", value, str)
    axes = tuple(a.strip() for a in value.split(",") if a.strip())
    for a in axes:
      if a not in MESH_AXES:
        fail(f"mesh_rules.{logical}", value, f"names mesh axis {a!r}; known: {MESH_AXES}")
    out[logical] = axes
  return out
