"""Checkpoints: round trip, retention, async, resharding, mismatch errors, corruption."""

import fnmatch
import gc
import glob
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from session_env import PATIENCE_S, xla_flags

from transformer.nn.config import ModelConfig
from transformer.train import checkpoints


def _state(seed=0):
  rng = np.random.default_rng(seed)
  params = {
    "dense": {
      "kernel": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
      "bias": jnp.asarray(rng.standard_normal(3), jnp.float32),
    },
    "embed": {"embedding": jnp.asarray(rng.standard_normal((5, 4)), jnp.bfloat16)},
  }
  tx = optax.adamw(1e-3)
  opt_state = tx.init(params)
  opt_state = jax.tree.map(lambda x: x + 0.25 if x.dtype != jnp.int32 else x + 2, opt_state)
  return {
    "params": params,
    "opt_state": opt_state,
    "step": jnp.asarray(7 + seed, jnp.int32),
    "rng": jax.random.key(seed),
  }


def _target(state, sharding=None):
  sharding = sharding or SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)


def _assert_bit_equal(a, b):
  a, b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(a) == len(b)
  for x, y in zip(a, b, strict=True):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_round_trip_is_bit_exact_with_data_state_and_config(tmp_path):
  state = _state()
  config = ml_collections.ConfigDict({"model": ModelConfig(d_model=64), "lr": 1e-3, "tags": ("a",)})
  data_state = {"position": 123, "shard": "0/1"}
  with checkpoints.CheckpointManager(tmp_path / "ckpt") as mngr:
    assert mngr.latest_step() is None and mngr.restore(_target(state)) is None
    assert mngr.save(7, state, data_state=data_state, config=config)
    mngr.wait_until_finished()
  with checkpoints.CheckpointManager(tmp_path / "ckpt") as mngr:  # a fresh process resumes
    assert mngr.latest_step() == 7
    restored = mngr.restore(_target(state))
  assert restored.step == 7
  _assert_bit_equal(restored.state, state)
  assert isinstance(restored.state["opt_state"][0], optax.ScaleByAdamState)
  assert restored.data_state == data_state
  assert restored.config["model"]["d_model"] == 64 and restored.config["tags"] == ["a"]
  path = checkpoints.write_config(config, tmp_path)
  assert json.loads(path.read_text()) == restored.config


def test_data_state_and_config_are_optional(tmp_path):
  with checkpoints.CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, _state())
    restored = mngr.restore(_target(_state()), step=1)
  assert restored.data_state is None and restored.config is None


def test_keeps_last_n_plus_best_by_metric(tmp_path):
  losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: None, 5: 3.0, 6: 2.5}
  state = _state()
  with checkpoints.CheckpointManager(tmp_path / "min", max_to_keep=2, best_metric="eval_loss") as m:
    for step, loss in losses.items():
      m.save(step, state, metrics=None if loss is None else {"eval_loss": loss, "acc": 0.5})
    m.wait_until_finished()
    assert m.all_steps() == [2, 5, 6] and m.best_step() == 2
  assert sorted(os.listdir(tmp_path / "min")) == ["2", "5", "6"]
  with checkpoints.CheckpointManager(tmp_path / "min", max_to_keep=2, best_metric="eval_loss") as m:
    assert m.best_step() == 2  # metrics persist across processes
  with checkpoints.CheckpointManager(
    tmp_path / "min", max_to_keep=2, best_metric="bleu", best_mode="max"
  ) as m:
    m.save(7, state, metrics={"bleu": 20.0})  # older checkpoints lack "bleu": ranked worst
    m.wait_until_finished()
    assert m.all_steps() == [6, 7] and m.best_step() == 7
  with checkpoints.CheckpointManager(
    tmp_path / "max", max_to_keep=1, best_metric="acc", best_mode="max", keep_best=2
  ) as m:
    for step, acc in {1: 0.1, 2: 0.9, 3: 0.3, 4: 0.8, 5: 0.2}.items():
      m.save(step, state, metrics={"acc": acc})
    m.wait_until_finished()
    assert m.all_steps() == [2, 4, 5] and m.best_step() == 2


def test_async_save_copies_state_before_returning(tmp_path):
  state = _state()
  expected = jax.tree.map(np.asarray, {"params": state["params"], "step": state["step"]})
  with checkpoints.CheckpointManager(tmp_path, async_save=True) as mngr:
    assert mngr.save(3, state)
    for leaf in jax.tree.leaves(state["params"]):
      leaf.delete()  # what donating the state to the next train step does
    mngr.wait_until_finished()
    assert (tmp_path / "3" / "state").is_dir() and mngr.all_steps() == [3]
    restored = mngr.restore(_target(_state()))
  for got, want in zip(
    jax.tree.leaves({"params": restored.state["params"], "step": restored.state["step"]}),
    jax.tree.leaves(expected),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_never_overwrites_an_existing_or_older_step(tmp_path):
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    assert mngr.save(5, _state(seed=0))
    assert not mngr.save(5, _state(seed=1))
    assert not mngr.save(4, _state(seed=1))
    mngr.wait_until_finished()
    assert mngr.all_steps() == [5]
    _assert_bit_equal(mngr.restore(_target(_state())).state, _state(seed=0))


def test_restore_onto_a_different_single_device_sharding(tmp_path):
  state = _state()
  device = jax.devices()[-1]
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, state)
    mngr.wait_until_finished()
    restored = mngr.restore(_target(state, SingleDeviceSharding(device)))
    unsharded = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    default = mngr.restore(unsharded)  # leaves without a sharding land on the first device
  for leaf in jax.tree.leaves(restored.state):
    assert leaf.sharding == SingleDeviceSharding(device)
  assert jax.tree.leaves(default.state)[0].sharding == SingleDeviceSharding(jax.devices()[0])
  _assert_bit_equal(restored.state, state)


def _eight_to_four_devices(directory):
  """Saves sharded over 8 devices, restores over 4 with another layout (needs 8 devices)."""
  devices = jax.devices()
  assert len(devices) >= 8, devices
  mesh8 = jax.sharding.Mesh(np.array(devices[:8]).reshape(4, 2), ("data", "model"))
  mesh4 = jax.sharding.Mesh(np.array(devices[4:8]), ("model",))
  state = {
    "kernel": jax.device_put(
      jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8), NamedSharding(mesh8, P("data", "model"))
    ),
    "bias": jax.device_put(jnp.arange(8.0), NamedSharding(mesh8, P())),
  }
  with checkpoints.CheckpointManager(directory) as mngr:
    mngr.save(10, state)
    mngr.wait_until_finished()
  target = {
    "kernel": jax.ShapeDtypeStruct(
      (16, 8), jnp.float32, sharding=NamedSharding(mesh4, P(None, "model"))
    ),
    "bias": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh4, P("model"))),
  }
  with checkpoints.CheckpointManager(directory) as mngr:
    restored = mngr.restore(target).state
  for name in state:
    assert restored[name].sharding == target[name].sharding
    np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(state[name]))
  mesh3 = jax.sharding.Mesh(np.array(devices[:3]), ("x",))
  bad = {**target, "bias": target["bias"].update(sharding=NamedSharding(mesh3, P("x")))}
  with checkpoints.CheckpointManager(directory) as mngr:
    with pytest.raises(ValueError, match=r"sharding cannot hold the shape \(1\):\n +bias"):
      mngr.restore(bad)  # 8 values cannot be split 3 ways
    assert mngr.all_steps() == [10]  # a bad target is not a corrupt checkpoint


def _on_eight_devices(function, directory) -> None:
  """`function(directory)` here if this process has 8 devices, else in a subprocess with 8
  fake CPU devices (`function` by its name in this module), which must end cleanly."""
  if len(jax.devices()) >= 8:
    function(directory)
    return
  code = textwrap.dedent(
    f"""
    import sys, pathlib
    sys.path.insert(0, {os.path.dirname(__file__)!r})
    import test_checkpoints
    test_checkpoints.{function.__name__}(pathlib.Path({str(directory)!r}))
    print("OK")
    """
  )
  env = {
    **os.environ,
    "XLA_FLAGS": xla_flags(8),
    "JAX_PLATFORMS": "cpu",
  }
  result = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=PATIENCE_S
  )
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_restore_sharded_over_8_devices_onto_4(tmp_path):
  _on_eight_devices(_eight_to_four_devices, tmp_path)


def test_mismatching_target_raises_value_error_naming_paths_and_keeps_checkpoint(tmp_path):
  state = _state()
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, state)
    mngr.wait_until_finished()
    target = _target(state)
    target["params"]["dense"]["kernel"] = jax.ShapeDtypeStruct((8, 3), jnp.float32)  # wider
    target["params"]["extra"] = jax.ShapeDtypeStruct((2,), jnp.float32)  # new layer
    del target["params"]["dense"]["bias"]  # removed
    target["params"]["embed"]["embedding"] = jax.ShapeDtypeStruct((5, 4), jnp.float32)
    with pytest.raises(ValueError) as info:
      mngr.restore(target)
    message = str(info.value)
    assert "missing from the checkpoint (1):\n    params/extra" in message
    assert "params/dense/bias" in message and "opt_state/0/mu/dense/bias" not in message
    assert "params/dense/kernel: saved (4, 3), target (8, 3)" in message
    assert "params/embed/embedding: saved bfloat16, target float32" in message
    with pytest.raises(ValueError, match="params/extra"):
      mngr.check_compatible(target, 1)
    assert mngr.all_steps() == [1] and not (tmp_path / checkpoints.CORRUPT_DIR).exists()
    cast = _target(state)
    cast["params"]["embed"]["embedding"] = jax.ShapeDtypeStruct((5, 4), jnp.float32)
    restored = mngr.restore(cast, check_dtypes=False)
    assert restored.state["params"]["embed"]["embedding"].dtype == jnp.float32


def _truncate_arrays(step_dir):
  files = glob.glob(f"{step_dir}/state/**/d/*", recursive=True)
  assert files
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)


def _truncate_largest_chunk(step_dir):
  """Leaves the metadata readable: only restoring the arrays fails."""
  path = max(glob.glob(f"{step_dir}/state/**/d/*", recursive=True), key=os.path.getsize)
  assert os.path.getsize(path) > 10_000
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _garble_data_json(step_dir):
  (step_dir / "data" / "process_0-of-1.json").write_text('{"position": 1')


def _delete_state_metadata(step_dir):
  os.remove(step_dir / "state" / "_METADATA")


def _big_state(seed):
  state = _state(seed)
  noise = np.random.default_rng(seed).standard_normal((128, 128)).astype(np.float32)
  state["params"]["big"] = jnp.asarray(noise)  # random: one large, incompressible chunk
  return state


# Reading a damaged tensorstore file leaves orphaned coroutines behind in orbax, reported
# by pytest as unraisable exceptions when collected; the restore itself behaves. The
# tests collect them (gc) while the filter is active so they do not surface later.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
  ("corrupt", "reason"),
  [
    (_truncate_arrays, "state"),
    (_truncate_largest_chunk, "state arrays unreadable"),
    (_garble_data_json, "item 'data' unreadable"),
    (_delete_state_metadata, "state item or its metadata is missing"),
  ],
)
def test_corrupt_latest_is_moved_aside_and_restore_falls_back(tmp_path, corrupt, reason):
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    for step in (1, 2, 3):
      mngr.save(step, _big_state(seed=step), data_state={"position": step})
    mngr.wait_until_finished()
  corrupt(tmp_path / "3")
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    with pytest.warns(checkpoints.CorruptCheckpointWarning, match=f"step 3 .*{reason}") as record:
      restored = mngr.restore(_target(_big_state(0)))
    assert len(record) == 1
    assert restored.step == 2 and restored.data_state == {"position": 2}
    _assert_bit_equal(restored.state, _big_state(seed=2))
    assert mngr.all_steps() == [1, 2] and mngr.latest_step() == 2
    assert (tmp_path / checkpoints.CORRUPT_DIR / "3" / "state").is_dir()  # kept, not deleted
    assert mngr.save(3, _big_state(seed=3))  # training resumed from 2 can save its step 3
    mngr.wait_until_finished()
    assert mngr.restore(_target(_big_state(0))).step == 3
  gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_explicit_step_raises_and_is_not_moved(tmp_path):
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, _state())
    mngr.wait_until_finished()
  _truncate_arrays(tmp_path / "1")
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ValueError, match="step 1 .* corrupt"):
      mngr.restore(_target(_state()), step=1)
    assert mngr.all_steps() == [1]
    with pytest.warns(checkpoints.CorruptCheckpointWarning):
      assert mngr.restore(_target(_state())) is None  # nothing valid left
    assert (tmp_path / checkpoints.CORRUPT_DIR / "1").is_dir()
  gc.collect()


def test_checkpoint_files_contain_no_pickle(tmp_path):
  with checkpoints.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, _state(), data_state={"a": [1, 2]}, config={"x": 1}, metrics=None)
    mngr.wait_until_finished()
  files = [p for p in glob.glob(f"{tmp_path}/**/*", recursive=True) if os.path.isfile(p)]
  assert len(files) > 5
  for path in files:
    with open(path, "rb") as f:
      head = f.read(2)
    assert not (head[:1] == b"\x80" and 2 <= head[1:2][0] <= 5), path  # pickle protocol 2-5
    assert not path.endswith((".pkl", ".pickle"))


@pytest.mark.parametrize(
  ("kwargs", "field"),
  [
    ({"max_to_keep": 0}, "max_to_keep"),
    ({"best_mode": "lowest"}, "best_mode"),
    ({"best_metric": ""}, "best_metric"),
    ({"keep_best": -1}, "keep_best"),
    ({"async_save": "yes"}, "async_save"),
  ],
)
def test_bad_constructor_arguments_raise(tmp_path, kwargs, field):
  with pytest.raises(ValueError, match=field):
    checkpoints.CheckpointManager(tmp_path, **kwargs)


def test_bad_save_and_restore_arguments_raise(tmp_path):
  with checkpoints.CheckpointManager(tmp_path, best_metric="eval_loss") as mngr:
    with pytest.raises(ValueError, match="step"):
      mngr.save(-1, _state())
    with pytest.raises(ValueError, match=r"\['name'\]"):
      mngr.save(1, {"w": jnp.ones(2), "name": "text"})
    with pytest.raises(ValueError, match="data_state"):
      mngr.save(1, _state(), data_state={"f": object()})
    with pytest.raises(ValueError, match="best_metric 'eval_loss'"):
      mngr.save(1, _state(), metrics={"loss": 1.0})
    with pytest.raises(ValueError, match="config value at fn"):
      mngr.save(1, _state(), config={"fn": print})
    assert mngr.all_steps() == []
    mngr.save(1, _state(), metrics={"eval_loss": 1.0})
    mngr.wait_until_finished()
    with pytest.raises(ValueError, match=r"saved steps \[1\]"):
      mngr.restore(_target(_state()), step=2)


def test_data_state_is_one_grain_file_per_process_and_legacy_json_still_restores(tmp_path):
  state = _state()
  with checkpoints.CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state, data_state={"position": 1})
    mngr.save(2, state, data_state={"position": 2})
  assert fnmatch.filter(os.listdir(tmp_path / "2" / "data"), "*.json") == ["process_0-of-1.json"]
  assert json.loads((tmp_path / "2" / "data" / "process_0-of-1.json").read_text()) == {
    "position": 2
  }
  # Step 1 as a checkpoint from before per-process states: one JSON item (`data/metadata`).
  os.remove(tmp_path / "1" / "data" / "process_0-of-1.json")
  (tmp_path / "1" / "data" / "metadata").write_text('{"position": 1}')
  with checkpoints.CheckpointManager(tmp_path, async_save=False) as mngr:
    restored = mngr.restore(_target(state), step=1)
    latest = mngr.restore(_target(state))
  assert restored.data_state == {"position": 1} and restored.data_processes is None
  assert restored.resumable_data_state() == {"position": 1}  # one process: exact
  assert latest.data_processes == 1 and latest.resumable_data_state() == {"position": 2}


def test_data_states_of_another_process_count_are_refused_naming_both_counts(tmp_path):
  state = _state()
  with checkpoints.CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(4, state, data_state={"position": 4})
  data = tmp_path / "4" / "data"
  os.rename(data / "process_0-of-1.json", data / "process_0-of-2.json")  # as 2 processes write
  (data / "process_1-of-2.json").write_text('{"position": 3}')
  with checkpoints.CheckpointManager(tmp_path, async_save=False) as mngr:
    restored = mngr.restore(_target(state))  # evaluation needs no data state: it restores
  assert restored.step == 4 and restored.data_processes == 2 and restored.data_state is None
  with pytest.raises(ValueError, match=r"states of 2 processes and this run has 1") as error:
    restored.resumable_data_state()
  assert "\n" not in str(error.value) and "resume with 2 processes" in str(error.value)


def _alter_first_element_of_part(step_dir, name, index):
  """Adds 1 to the first element of `index` (a tuple of slices) of array `name`, through
  tensorstore: the chunk stays well-formed, as after a byte flipped inside it."""
  import tensorstore as ts

  kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{step_dir}/state/"}}
  array = ts.open({"driver": "zarr", "kvstore": {**kvstore, "path": f"{name}/"}}).result()
  start = tuple(s.start for s in index)
  array[start].write(array[start].read().result() + 1).result()


def _shard_checksums(directory):
  """Sums of every shard of an array split over 8 devices, checked on the same and on
  another layout (needs 8 devices)."""
  devices = jax.devices()
  assert len(devices) >= 8, devices
  mesh8 = jax.sharding.Mesh(np.array(devices[:8]).reshape(4, 2), ("data", "model"))
  sharded = NamedSharding(mesh8, P("data", "model"))
  kernel = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
  state = {
    "kernel": jax.device_put(kernel, sharded),
    "bias": jax.device_put(jnp.arange(8.0), NamedSharding(mesh8, P())),
  }
  with checkpoints.CheckpointManager(directory, async_save=False) as mngr:
    for step in (1, 2, 3):
      mngr.save(step, state)
  sums = json.loads((directory / "3" / "checksums" / "metadata").read_text())
  assert sorted(sums["crc32"]) == ["bias"]  # replicated: one whole-array sum
  parts = sums["shards"]["kernel"]["parts"]
  assert [index for index, _ in parts] == [
    [[r, r + 4], [c, c + 4]] for r in range(0, 16, 4) for c in (0, 4)
  ]
  _alter_first_element_of_part(directory / "3", "kernel", (slice(8, 12), slice(4, 8)))
  _alter_first_element_of_part(directory / "2", "kernel", (slice(0, 4), slice(0, 4)))
  same = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
  whole = jax.tree.map(lambda x: x.update(sharding=NamedSharding(mesh8, P())), same)
  with checkpoints.CheckpointManager(directory, async_save=False) as mngr:
    with pytest.raises(ValueError, match=r"step 3 .*kernel\[8:12,4:8\] \(saved crc32"):
      mngr.restore(same, step=3)
    with pytest.raises(ValueError, match=r"step 2 .*kernel\[0:4,0:4\] \(saved crc32"):
      mngr.restore(whole, step=2)  # replicated on restore: every saved part is inside
    with pytest.warns(checkpoints.CorruptCheckpointWarning) as caught:
      restored = mngr.restore(same)
  assert [str(w.message).split(" in ")[0] for w in caught] == [
    "checkpoint step 3",
    "checkpoint step 2",
  ]
  assert restored.step == 1
  np.testing.assert_array_equal(np.asarray(restored.state["kernel"]), np.asarray(kernel))


def test_checksums_cover_every_shard_of_a_sharded_array(tmp_path):
  _on_eight_devices(_shard_checksums, tmp_path)
