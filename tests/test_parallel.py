"""Mesh parallelism on 8 fake CPU devices: data, FSDP, tensor and mixed layouts train exactly
like one device, parameters are sharded as the rules say, and checkpoints move between
device counts."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from conftest import train_losses
from jax.sharding import PartitionSpec as P
from session_env import PATIENCE_S, xla_flags

from transformer import tasks
from transformer.nn import partitioning
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train.checkpoints import CheckpointManager
from transformer.train.parallel import StepRunner
from transformer.train.step import StepConfig, create_train_state, train_step

B, T, V = 16, 8, 32
SINGLE = {"data": 1}
MIXED = {"data": 2, "fsdp": 2, "tensor": 2}


def _config(family: str) -> ModelConfig:
  extra = {"num_classes": 4, "image_size": 8, "patch_size": 4} if family == "vit" else {}
  return ModelConfig(
    family=family,
    vocab_size=V,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    num_layers=1,
    d_ff=64,
    max_len=16,
    **extra,
  )


def _smoothed(cls: type[tasks.Task]) -> tasks.Task:
  """The task with label smoothing 0.1 (its other options at their defaults)."""
  return cls(options=cls.Options(label_smoothing=0.1))


def _batches(kind: str, n: int = 5) -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    ids = rng.integers(1, V, size=(B, T + 1)).astype(np.int32)
    seg = np.ones((B, T), np.int32)
    pos = np.tile(np.arange(T, dtype=np.int32), (B, 1))
    if kind in ("lm", "mlm"):
      scored = np.ones((B, T), bool) if kind == "lm" else rng.random((B, T)) < 0.3  # mlm: ~30%
      b = dict(
        inputs=ids[:, :-1],
        targets=ids[:, 1:],
        weights=scored.astype(np.float32),
        segment_ids=seg,
        positions=pos,
      )
    elif kind == "seq2seq":
      b = dict(
        inputs=ids[:, :-1],
        targets=ids[:, 1:],
        inputs_segment_ids=seg,
        targets_segment_ids=seg,
        inputs_positions=pos,
        targets_positions=pos,
        weights=np.ones((B, T), np.float32),
      )
    else:
      b = dict(
        image=rng.standard_normal((B, 8, 8, 3)).astype(np.float32),
        label=rng.integers(0, 4, size=(B,)).astype(np.int32),
      )
    out.append(b)
  return out


KIND = {"decoder": "lm", "encoder": "mlm", "seq2seq": "seq2seq", "vit": "image"}


def _setup(family: str, mesh_shape: dict, kind: str):
  cfg = _config(family)
  model = build_model(cfg)
  # eps 1e-4: Adam divides by sqrt(v) + eps, and with the default 1e-8 a parameter whose
  # gradient is ~0 (ViT's encoder behind a zero-initialised head) turns reduction-order
  # noise into lr-sized steps, so no two device layouts could agree.
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, eps=1e-4, weight_decay=0.01))
  devices = jax.devices()[:1] if mesh_shape == SINGLE else None
  mesh = partitioning.make_mesh(mesh_shape, devices)
  runner = StepRunner(
    StepConfig(model=model, tx=tx, task=_smoothed(tasks.get(kind))), "jit", mesh, update=train_step
  )
  args, kwargs = tasks.get(kind)().init_args(jax.tree.map(lambda x: x[:1], _batches(kind, 1)[0]))
  params = jax.jit(lambda r: model.init(r, *args, **kwargs))(jax.random.PRNGKey(0))["params"]
  return runner, create_train_state(jax.device_get(params), tx, jax.random.PRNGKey(1))


LAYOUTS = [
  ("decoder", {"data": 8}),
  ("decoder", {"data": 1, "fsdp": 8}),
  ("decoder", {"data": 2, "tensor": 4}),
  ("decoder", MIXED),
  ("encoder", MIXED),
  ("seq2seq", MIXED),
  ("vit", MIXED),
]
_BASELINES: dict[str, np.ndarray] = {}


@pytest.mark.parametrize("family,mesh_shape", LAYOUTS, ids=lambda x: str(x))
def test_layout_matches_one_device_and_shards_as_the_rules_say(family, mesh_shape):
  kind = KIND[family]
  batches = _batches(kind)
  if family not in _BASELINES:
    _BASELINES[family], _ = train_losses(*_setup(family, SINGLE, kind), batches)
  losses, state = train_losses(*_setup(family, mesh_shape, kind), batches)
  np.testing.assert_allclose(losses, _BASELINES[family], atol=1e-5)

  mesh = partitioning.make_mesh(mesh_shape)
  axes = partitioning.logical_axes(state.params)
  for (path, leaf), (_, ax) in zip(
    jax.tree_util.tree_leaves_with_path(state.params),
    jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple)),
    strict=True,
  ):
    expected = partitioning.spec_for(ax, leaf.shape, mesh)
    assert leaf.sharding.spec == expected, jax.tree_util.keystr(path)
  # The rules really shard something: FFN inputs over tensor and/or fsdp.
  wi = [
    leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)
    if "wi" in jax.tree_util.keystr(path) and "kernel" in jax.tree_util.keystr(path)
  ][0]
  expected_wi = P(
    "fsdp" if mesh.shape["fsdp"] > 1 else None, "tensor" if mesh.shape["tensor"] > 1 else None
  )
  assert wi.sharding.spec == expected_wi
  if mesh.shape["fsdp"] > 1 or mesh.shape["tensor"] > 1:
    assert wi.addressable_shards[0].data.size < wi.size  # each device holds a slice
    mu = state.opt_state[1][0].mu  # adamw moments follow the parameters
    assert jax.tree.leaves(mu)[0].sharding.spec == jax.tree.leaves(state.params)[0].sharding.spec


def test_every_parameter_of_every_family_has_logical_axes():
  for family in KIND:
    for extra in ({}, {"scan_layers": True}):
      cfg = _config(family).replace(**extra)
      model = build_model(cfg)
      kind = KIND[family]
      args, kwargs = tasks.get(kind)().init_args(
        jax.tree.map(lambda x: x[:1], _batches(kind, 1)[0])
      )
      init = lambda m=model, a=args, k=kwargs: m.init(jax.random.PRNGKey(0), *a, **k)
      params = jax.eval_shape(init)["params"]
      axes = partitioning.logical_axes(params)
      for ax, leaf in zip(
        jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)),
        jax.tree.leaves(params),
        strict=True,
      ):
        assert len(ax) == len(leaf.shape)


def test_bad_mesh_is_a_clear_error():
  with pytest.raises(ValueError, match="needs 16 devices, have 8"):
    partitioning.make_mesh({"data": 4, "tensor": 4})
  with pytest.raises(ValueError, match="unknown axes"):
    partitioning.make_mesh({"model": 2})
  with pytest.raises(ValueError, match="unknown axes"):
    partitioning.make_mesh({"data": 4}, dcn={"model": 2})
  with pytest.raises(ValueError) as error:  # one process here: one slice
    partitioning.make_mesh({"data": 4}, dcn={"data": 2})
  assert str(error.value) == (
    "config.mesh: dcn_data=2 = 2 slices, but the devices form 1 processes (one per slice)"
  )


def test_checkpoint_from_8_devices_restores_on_4_and_1_and_continues(tmp_path):
  kind = "lm"
  batches = _batches(kind, 6)
  runner8, state = _setup("decoder", MIXED, kind)
  state = runner8.place_state(state)
  for b in batches[:3]:
    state, _ = runner8.train(state, b)
  with CheckpointManager(tmp_path, async_save=False) as mgr:
    mgr.save(3, state)
  reference, _ = train_losses(runner8, state, batches[3:])

  for shape, devices in (
    ({"data": 2, "tensor": 2}, jax.devices()[:4]),
    (SINGLE, jax.devices()[:1]),
  ):
    runner, fresh = _setup("decoder", SINGLE, kind)
    mesh = partitioning.make_mesh(shape, devices)
    runner = StepRunner(runner.cfg, "jit", mesh, update=train_step)
    with CheckpointManager(tmp_path, async_save=False) as mgr:
      restored = mgr.restore(runner.state_target(jax.eval_shape(lambda f=fresh: f)))
    assert restored.step == 3
    leaf = jax.tree.leaves(restored.state.params)[0]
    assert len(leaf.sharding.device_set) == len(devices)
    losses, _ = train_losses(runner, restored.state, batches[3:])
    np.testing.assert_allclose(losses, reference, atol=1e-5)


def _losses(workdir) -> list[float]:
  import json
  import os

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["loss"] for r in map(json.loads, f)]


def test_two_processes_on_localhost_match_one_process(tmp_path):
  """jax.distributed over CPU (gloo): two processes of 4 devices each, joined as two
  slices of a hybrid mesh (`mesh.dcn_data=2`, the processes standing for slices), each
  feeding its half of the global batch, train as one process of one device does; the
  data axis spans the processes."""
  import os
  import socket
  import subprocess
  import sys

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def command(workdir, *extra):
    return [
      sys.executable,
      os.path.join(repo, "train.py"),
      f"--config={os.path.join(repo, 'tests', 'tiny_lm_config.py')}",
      f"--workdir={workdir}",
      "--config.model.dropout_rate=0.0",
      "--config.num_train_steps=4",
      *extra,
    ]

  env = {**os.environ, "XLA_FLAGS": xla_flags(1)}
  single = subprocess.run(command(tmp_path / "one"), env=env, capture_output=True, text=True)
  assert single.returncode == 0, single.stderr[-2000:]

  def two_processes(workdir, *extra):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    procs = [
      subprocess.Popen(
        command(workdir, *extra),
        env={
          **env,
          "XLA_FLAGS": xla_flags(4),
          "TRANSFORMER_COORDINATOR": f"127.0.0.1:{port}",
          "TRANSFORMER_NUM_PROCESSES": "2",
          "TRANSFORMER_PROCESS_ID": str(i),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
      for i in range(2)
    ]
    outputs = [p.communicate(timeout=PATIENCE_S)[0] for p in procs]
    return [p.returncode for p in procs], outputs

  codes, outputs = two_processes(tmp_path / "two", "--config.mesh.dcn_data=2")
  assert codes == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
  assert "mesh: data 8 (processes [0, 0, 0, 0, 1, 1, 1, 1])" in outputs[0], outputs[0][-2000:]
  one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
  assert len(one) == len(two) >= 3
  np.testing.assert_allclose(two, one, atol=1e-5)
