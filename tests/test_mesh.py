"""The (data, fsdp, tensor, expert, context) mesh of `partitioning.make_mesh`, on the 8
fake CPU devices.

The mesh comes from `jax.make_mesh` (device order by physical topology on TPU slices and
multi-GPU hosts), with `-1` inferring one size, axis types `Auto`, and one-line errors
naming config.mesh.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from transformer.nn import partitioning


@pytest.mark.parametrize(
  "shape, sizes",
  [
    ({"data": -1}, (8, 1, 1, 1, 1)),
    ({"data": 2, "fsdp": 2, "tensor": 2}, (2, 2, 2, 1, 1)),
    ({"fsdp": -1, "tensor": 2}, (1, 4, 2, 1, 1)),
    ({"data": 2, "tensor": -1}, (2, 1, 4, 1, 1)),
    ({"data": 1, "fsdp": 8}, (1, 8, 1, 1, 1)),
    ({"data": 2, "expert": 4}, (2, 1, 1, 4, 1)),
    ({"context": 4, "data": -1}, (2, 1, 1, 1, 4)),
    ({}, None),  # every size 1: needs exactly one device
  ],
)
def test_mesh_shape_and_axis_names(shape, sizes):
  assert len(jax.devices()) == 8  # tests/conftest.py
  if sizes is None:
    with pytest.raises(ValueError, match="needs 1 devices, have 8"):
      partitioning.make_mesh(shape)
    return
  mesh = partitioning.make_mesh(shape)
  assert mesh.axis_names == ("data", "fsdp", "tensor", "expert", "context")
  assert tuple(mesh.devices.shape) == sizes
  assert dict(mesh.shape) == dict(zip(partitioning.MESH_AXES, sizes, strict=True))
  assert mesh.axis_types == (AxisType.Auto,) * 5  # as a plain Mesh: XLA propagates shardings
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_mesh_is_jax_make_mesh(monkeypatch):
  """The devices are placed by `jax.make_mesh` (topology-aware), not by a reshape."""
  calls = []
  real = jax.make_mesh

  def spy(axis_shapes, axis_names, *args, **kwargs):
    calls.append((tuple(axis_shapes), tuple(axis_names)))
    return real(axis_shapes, axis_names, *args, **kwargs)

  monkeypatch.setattr(jax, "make_mesh", spy)
  mesh = partitioning.make_mesh({"data": 2, "tensor": -1})
  assert calls == [((2, 1, 4, 1, 1), ("data", "fsdp", "tensor", "expert", "context"))]
  expected = real(
    (2, 1, 4, 1, 1), ("data", "fsdp", "tensor", "expert", "context"), devices=jax.devices()
  )
  np.testing.assert_array_equal(
    np.vectorize(lambda d: d.id)(mesh.devices), np.vectorize(lambda d: d.id)(expected.devices)
  )


def test_mesh_on_a_subset_of_devices():
  devices = jax.devices()[4:]
  mesh = partitioning.make_mesh({"data": -1, "tensor": 2}, devices)
  assert tuple(mesh.devices.shape) == (2, 1, 2, 1, 1)
  assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}
  one = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
  assert one.devices.size == 1 and one.devices.flat[0] == jax.devices()[0]


@pytest.mark.parametrize(
  "shape, message",
  [
    (
      {"model": 2},
      r"config.mesh: unknown axes \['model'\]; expected \('data', 'fsdp', 'tensor', 'expert',"
      r" 'context'\)",
    ),
    ({"data": -1, "fsdp": -1}, "sizes must be >= 1, with at most one -1"),
    ({"data": 0}, "sizes must be >= 1, with at most one -1"),
    ({"data": -2}, "sizes must be >= 1, with at most one -1"),
    ({"data": -1, "tensor": 3}, "8 devices not divisible by 3"),
    ({"data": 4, "tensor": 4}, "needs 16 devices, have 8"),
    ({"data": 2, "fsdp": 2}, "needs 4 devices, have 8"),
  ],
)
def test_bad_mesh_messages(shape, message):
  with pytest.raises(ValueError, match=message):
    partitioning.make_mesh(shape)


def test_sharded_step_inputs_on_the_mesh():
  """A parameter sharded by the rules lands on the mesh's devices, one shard per position."""
  mesh = partitioning.make_mesh({"fsdp": 2, "tensor": 4})
  spec = partitioning.spec_for(("embed", "mlp"), (8, 16), mesh)
  assert spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  x = jax.device_put(np.arange(128.0).reshape(8, 16), jax.sharding.NamedSharding(mesh, spec))
  assert len(x.sharding.device_set) == 8
  assert {s.data.shape for s in x.addressable_shards} == {(4, 4)}
  np.testing.assert_array_equal(np.asarray(x), np.arange(128.0).reshape(8, 16))
