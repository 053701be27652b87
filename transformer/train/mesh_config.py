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
  # Multi-slice (several TPU slices, or GPU / CPU hosts on a slow link): ways across slices.
  # The sizes above are then per slice, and an axis is (size x dcn size) long in all.
  dcn_data: int = 1  # data-parallel ways across slices (the usual choice: gradients only)
  dcn_fsdp: int = 1  # fsdp ways across slices (parameters gathered over the slow link)

  def __post_init__(self):
    sizes = self.shape()
    for name, size in sizes.items():
      if size == 0 or size < -1:
        fail(f"mesh.{name}", size, "must be >= 1, or -1 for all remaining devices")
    if list(sizes.values()).count(-1) > 1:
      fail("mesh", sizes, "at most one axis may be -1")
    for name, size in self.dcn().items():
      if size < 1:
        fail(f"mesh.dcn_{name}", size, "must be >= 1 (slices along the axis)")

  def shape(self) -> dict[str, int]:
    """Devices per axis (per slice, with DCN sizes)."""
    fields = dataclasses.asdict(self)
    return {k: v for k, v in fields.items() if not k.startswith("dcn_")}

  def dcn(self) -> dict[str, int]:
    """Slices per axis (`partitioning.make_mesh`'s `dcn`)."""
    return {"data": self.dcn_data, "fsdp": self.dcn_fsdp}


def check(mesh: MeshConfig, parallelism: str, model: ModelConfig) -> None:
  """The mesh against the loop's parallelism and the model: one line naming the field."""
  spread = (mesh.fsdp, mesh.tensor, mesh.expert, mesh.context, mesh.dcn_fsdp, mesh.dcn_data)
  if parallelism == "pmap" and spread != (1,) * 6:
    only = (
      "is data parallelism on one slice only: use jit for fsdp / tensor / expert / context / dcn"
    )
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
