"""Fault injection end to end: nothing is lost, every failure is one clear line.

  kills       SIGKILL at seeded random moments, then the same command: bit-exact resume
  preemption  SIGTERM saves the current step and exits 0 within the grace period, or
              exits without it when the grace runs out, the previous checkpoint intact
  lock        a second run on a workdir in use is refused naming the owner; a dead
              owner's lock is recovered
  corruption  truncated and bit-flipped checkpoints are detected, moved aside, and the
              run falls back to the newest valid one and finishes bit-exactly
  numerics    a NaN in the inputs, loss or gradients stops the run naming the step, the
              quantity and the last good checkpoint; `skip_nonfinite` skips and counts
  configs     malformed configs and overrides (hypothesis) end in one line naming the field
  data        empty, binary, non-UTF-8, huge-line, truncated-gzip and wrong-shape inputs
  security    pickle payloads planted in a workdir are never unpickled by eval or resume

The subprocess runs use tests/fault_harness.py (also behind benchmarks/kill_resume.py,
the 20-trial sweep) and share a persistent compilation cache.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import glob
import gzip
import io
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import typing

import fault_harness as fh
import jax
import ml_collections
import numpy as np
import pytest
import tiny_lm_config as tiny_lm_config_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer.data.tokenizers import load_tokenizer
from transformer.eval import evaluate as eval_lib
from transformer.nn.config import ModelConfig
from transformer.train import checkpoints, experiment
from transformer.train import loop as train_lib

REPO = fh.REPO


# The in-process runs: tests/tiny_lm_config.py with one layer, no dropout, 4 updates,
# checkpoints every 2, evaluation only at the end. As train.py flags: `_flags(**changes)`.
IN_PROCESS = {
  "model.num_layers": 1,
  "model.dropout_rate": 0.0,
  "num_train_steps": 4,
  "checkpoint_every": 2,
  "log_every": 1,
  "eval_batches": 1,
}


def tiny_lm_config(**changes):
  config = tiny_lm_config_file.get_config()
  for key, value in {**IN_PROCESS, **changes}.items():
    block, _, name = key.rpartition(".")
    (config[block] if block else config)[name] = value
  return config


def _flags(**changes) -> list[str]:
  return [f"--config.{k}={v}" for k, v in {**IN_PROCESS, **changes}.items()]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("compile_cache"))


# --------------------------------------------------------------------------------------
# Kills, preemption and the workdir lock (train.py subprocesses).


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, compile_cache):
  """An uninterrupted train.py run of the kill configuration: its final state and the
  length of its training phase after compilation."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  source = fh.source_fingerprint()
  run = fh.Run(fh.train_command(workdir, *fh.KILL_RUN), fh.child_env(compile_cache))
  assert run.wait() == 0, run.output()[-3000:]
  first_step = next(t for t, line in run.lines if line.startswith("step 1/"))
  _, end = fh.training_window(run)
  return {**fh.final_state(workdir), "duration": end - first_step, "source": source}


def _first_update(run: fh.Run) -> float:
  """When the run printed the progress line of its first update (compilation done)."""
  return run.wait_for(lambda line: re.match(r"step \d+/", line) is not None)


def _owner(workdir):
  with open(os.path.join(workdir, "run.lock")) as f:
    return json.load(f)


@pytest.mark.slow
def test_kills_preemption_and_locks_then_resume_is_bit_exact(
  tmp_path, reference_run, compile_cache
):
  """One workdir through: SIGKILL, SIGKILL, SIGTERM with a grace period too short to save,
  a second run refused while the first is stopped, SIGTERM that saves; the same command
  then finishes the run, whose train state equals the uninterrupted run's byte for byte."""
  env = fh.child_env(compile_cache)
  workdir = str(tmp_path / "run")
  command = fh.train_command(workdir, *fh.KILL_RUN)
  rng = np.random.default_rng(2024)
  span = reference_run["duration"]
  kills = []

  # Two SIGKILLs at random moments: nothing is saved on the way out, the lock stays, and
  # the next run takes it over.
  left_lock = False
  for _ in range(2):
    run = fh.Run(command, env)
    delay = float(rng.uniform(0.0, 0.25) * span)  # each run leaves work for the next ones
    killed = fh.interrupt(run, workdir, delay, signal.SIGKILL, since=_first_update(run))
    kills.append(killed["phase"])
    assert "Traceback" not in run.output()
    assert not left_lock or "removed the stale lock" in run.output(), run.output()[-3000:]
    left_lock = killed["code"] == -signal.SIGKILL  # (unless the run had already finished)
    if left_lock:
      assert _owner(workdir)["pid"] == run.proc.pid

  # SIGTERM with a grace period no save fits in: exit 0 at once, the latest complete
  # checkpoint untouched and named.
  run = fh.Run([*command, "--config.preemption_grace_seconds=0.001"], env)
  delay = float(rng.uniform(0.0, 0.15) * span)
  term = fh.interrupt(run, workdir, delay, signal.SIGTERM, since=_first_update(run))
  kills.append(f"SIGTERM {term['phase']}")
  out = run.output()
  assert not left_lock or "removed the stale lock" in out, out[-3000:]
  assert term["code"] == 0, out[-3000:]
  assert term["phase"].split("+")[0] in ("train", "eval", "save"), term  # during training
  match = re.search(
    r"before the checkpoint at step (\d+) was written; exiting without it\. "
    r"The latest complete checkpoint is (step (\d+)|none)",
    out,
  )
  assert match, out[-3000:]
  on_disk = fh.saved_steps(workdir)
  assert on_disk[-1:] == ([int(match[3])] if match[3] else []) and int(match[1]) not in on_disk
  assert not os.path.exists(os.path.join(workdir, "run.lock"))

  # A run in progress (stopped with SIGSTOP so it cannot finish meanwhile) keeps a second
  # run out; that one says who holds the workdir, in one line.
  run = fh.Run(command, env)
  _first_update(run)
  run.signal(signal.SIGSTOP)
  second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
  run.signal(signal.SIGCONT)
  resumed_at = time.monotonic()
  assert second.returncode == 1
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: workdir {workdir} is in use by process {run.proc.pid} on ")
  assert "train.py" in last and "Traceback" not in second.stderr
  # ... and a SIGTERM makes it save the step it is at and exit 0.
  delay = float(rng.uniform(0.0, 0.15) * span)
  term = fh.interrupt(run, workdir, delay, signal.SIGTERM, since=resumed_at)
  out = run.output()
  assert term["code"] == 0, out[-3000:]
  assert term["phase"].split("+")[0] in ("train", "eval", "save"), term  # during training
  match = re.search(r"SIGTERM: saved a checkpoint at step (\d+)", out)
  assert match, out[-3000:]
  assert fh.saved_steps(workdir)[-1] == int(match[1])
  kills.append(f"SIGTERM {term['phase']}")
  print(f"interruptions: {kills}")

  # The same command finishes the run: bit-exact.
  run = fh.Run(command, env)
  assert run.wait() == 0, run.output()[-3000:]
  assert "resumed from step" in run.output()
  final = fh.final_state(workdir)
  assert final["step"] == reference_run["step"] == 40
  changed = fh.source_fingerprint() != reference_run["source"]
  assert fh.bit_equal(final["state"], reference_run["state"]) == [], (
    kills,
    "transformer/*.py changed while the runs ran" if changed else "same code throughout",
  )


# --------------------------------------------------------------------------------------
# Numerics: injected NaNs stop the run (naming step, quantity, last good checkpoint) or
# are skipped and counted.


@pytest.mark.parametrize(
  ("where", "named"),
  [
    ("inputs", "non-finite inputs (a NaN/Inf in the batch)"),
    ("loss", "non-finite loss (nan)"),
    ("grads", "non-finite gradients (global norm nan)"),
  ],
)
def test_injected_nan_stops_naming_step_quantity_and_last_good_checkpoint(tmp_path, where, named):
  workdir = str(tmp_path / "run")
  config = tiny_lm_config(debug_inject_nan_at_step=3, debug_inject_nan_in=where)
  with pytest.raises(train_lib.NonFiniteError) as error:
    train_lib.train_and_evaluate(config, workdir)
  message = str(error.value)
  assert message.startswith(f"step 3: {named}")
  assert f"last good checkpoint: step 2 in {workdir}/checkpoints (kept)" in message
  assert "\n" not in message
  if where == "grads":
    assert "loss was " in message  # the loss itself was finite
  assert fh.saved_steps(workdir) == [2]  # nothing written past the NaN
  assert not os.path.exists(os.path.join(workdir, "run.lock"))


def test_skip_nonfinite_skips_the_update_and_counts_it(tmp_path):
  workdir = str(tmp_path / "run")
  config = tiny_lm_config(
    debug_inject_nan_at_step=3, debug_inject_nan_in="grads", skip_nonfinite=True, checkpoint_every=1
  )
  train_lib.train_and_evaluate(config, workdir)
  with checkpoints.CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False) as m:
    states = {step: m.restore_numpy(step) for step in (2, 3, 4)}
  assert fh.bit_equal(states[2]["params"], states[3]["params"]) == []  # update 3 not applied
  assert fh.bit_equal(states[3]["params"], states[4]["params"])  # update 4 was
  assert int(states[4]["nonfinite_count"]) == 1 and int(states[4]["first_nonfinite_step"]) == 3
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = {r["step"]: r for r in map(json.loads, f) if r["split"] == "train"}
  assert logged[2]["nonfinite_skipped"] == 0 and logged[3]["nonfinite_skipped"] == 1
  assert logged[3]["grad_norm"] is None  # NaN, written as null


# --------------------------------------------------------------------------------------
# Corrupt checkpoints, end to end; untrusted files.


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished 6-update run with checkpoints at 2, 4 and 6, and its final state."""
  workdir = str(tmp_path_factory.mktemp("trained") / "run")
  train_lib.train_and_evaluate(tiny_lm_config(num_train_steps=6), workdir)
  assert fh.saved_steps(workdir) == [2, 4, 6]
  return {"workdir": workdir, **fh.final_state(workdir)}


def _array_files(step_dir):
  """The OCDBT data files of a checkpoint's state (where orbax puts the array chunks)."""
  files = glob.glob(f"{step_dir}/state/**/d/*", recursive=True)
  assert files
  return files


def _alter_array_silently(ckpt: str, step: int, name: str) -> None:
  """Adds 1 to the first element of array `name` of checkpoint `step`, through tensorstore:
  compression and indexes stay valid, so orbax reads the new value without any error (as
  it does a byte flipped inside a compressed chunk; see docs/RELIABILITY.md)."""
  import tensorstore as ts

  with checkpoints.CheckpointManager(ckpt, async_save=False) as mngr:
    before = mngr.restore_numpy(step)
    kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{ckpt}/{step}/state/"}}
    array = ts.open({"driver": "zarr", "kvstore": {**kvstore, "path": f"{name}/"}}).result()
    values = array.read().result()
    values.reshape(-1)[0] += 1.0
    array.write(values).result()
    after = mngr.restore_numpy(step)  # no error: only the values differ
  assert fh.bit_equal(after, before) == [f"[{']['.join(repr(k) for k in name.split('.'))}]"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_truncated_and_silently_altered_checkpoints_fall_back_and_finish_bit_exact(
  tmp_path, trained, compile_cache
):
  workdir = str(tmp_path / "run")
  shutil.copytree(trained["workdir"], workdir)
  ckpt = os.path.join(workdir, "checkpoints")
  for path in _array_files(f"{ckpt}/6"):  # truncated: unreadable chunks
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  _alter_array_silently(ckpt, 4, "params.decoder.final_norm.scale")

  # The same run again, through train.py (as many devices as this process has).
  env = fh.child_env(compile_cache, devices=jax.device_count())
  rerun = fh.Run(fh.train_command(workdir, *_flags(num_train_steps=6)), env)
  assert rerun.wait() == 0, rerun.output()[-3000:]
  out = rerun.output()
  reasons = re.findall(r"CorruptCheckpointWarning: (.*)", out)
  assert len(reasons) == 2, out[-3000:]
  unreadable = r"\((state arrays unreadable|cannot read the state metadata): .*\); moved to "
  assert re.search(r"step 6 .* is corrupt " + unreadable, reasons[0]), reasons
  assert re.search(
    r"step 4 .* is corrupt \(checksum mismatch in 1 array\(s\): params/decoder/final_norm/scale "
    r"\(saved crc32 "
    r"0x[0-9a-f]{8}, read 0x[0-9a-f]{8}\)\); moved to .*corrupt/4",
    reasons[1],
  ), reasons
  assert "resumed from step 2" in out
  for step in ("4", "6"):  # kept aside, not deleted
    assert os.path.isdir(os.path.join(ckpt, checkpoints.CORRUPT_DIR, step, "state"))
  assert fh.saved_steps(workdir) == [2, 4, 6]  # resumed from 2 and saved 4 and 6 again
  final = fh.final_state(workdir)
  assert final["step"] == 6 and fh.bit_equal(final["state"], trained["state"]) == []


class _Payload:
  """Unpickling this creates the file `marker` (standing in for arbitrary code)."""

  def __init__(self, marker: str):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def _abstract(tree):
  import jax

  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_pickle_payloads_planted_in_a_workdir_never_run(tmp_path, trained):
  marker = str(tmp_path / "PWNED")
  payload = pickle.dumps(_Payload(marker))
  control = str(tmp_path / "control")
  pickle.loads(pickle.dumps(_Payload(control)))  # the payload is live: unpickling runs it
  assert os.path.exists(control)

  workdir = str(tmp_path / "run")
  shutil.copytree(trained["workdir"], workdir)
  ckpt = os.path.join(workdir, "checkpoints")
  (vocab,) = glob.glob(f"{workdir}/tokenizers/*/char_vocab.json")
  # Beside the files the loaders read: never opened. eval.py's path evaluates step 6.
  for path in (
    f"{ckpt}/6/state.pkl",
    f"{ckpt}/6/state/params.pkl",
    f"{ckpt}/6/data/state.pkl",
    vocab.replace(".json", ".pkl"),
    f"{workdir}/config.pkl",
  ):
    with open(path, "wb") as f:
      f.write(payload)
  np.save(f"{ckpt}/6/state/params.npy", np.array([_Payload(marker)], dtype=object))
  result = eval_lib.evaluate(workdir)
  assert result["step"] == 6 and np.isfinite(result["loss"])

  # In place of the files the loaders parse: a clean error (or a fallback), no execution.
  target = _abstract(trained["state"])
  with open(f"{ckpt}/4/state/_METADATA", "wb") as f:  # orbax: JSON
    f.write(payload)
  with open(f"{ckpt}/6/state/checkpoint", "wb") as f:  # orbax's aggregate file: msgpack
    f.write(payload)
  with checkpoints.CheckpointManager(ckpt, async_save=False) as mngr:
    with pytest.raises(ValueError, match=r"step 4 .* is corrupt: cannot read the state metadata"):
      mngr.restore(target, step=4)
    with pytest.warns(checkpoints.CorruptCheckpointWarning) as caught:
      assert mngr.restore(target).step == 2  # 6 and 4 moved aside
  assert [str(w.message).split(" in ")[0] for w in caught] == [
    "checkpoint step 6",
    "checkpoint step 4",
  ]
  with open(f"{workdir}/model_config.json", "wb") as f:  # JSON
    f.write(payload)
  with pytest.raises(ValueError, match="model_config.json: unreadable saved model config"):
    train_lib.load_model_config(workdir)
  with open(vocab, "wb") as f:  # JSON
    f.write(payload)
  with pytest.raises(ValueError, match="not a tokenizer JSON file"):
    load_tokenizer(vocab)
  spm = tmp_path / "spm_unigram_64.model"  # SentencePiece: a protobuf
  spm.write_bytes(payload)
  with pytest.raises(ValueError, match="not a usable SentencePiece model"):
    load_tokenizer(spm)
  assert not os.path.exists(marker)


def test_no_unsafe_deserialiser_in_the_package():
  """Nothing in transformer/ can unpickle: no pickle/dill/marshal/torch.load/yaml.load,
  no np.load with allow_pickle."""
  unsafe = re.compile(
    r"\b(pickle|cPickle|dill|cloudpickle|marshal|shelve)\.(loads?|Unpickler)\b"
    r"|torch\.load|yaml\.(unsafe_)?load\(|allow_pickle\s*=\s*True|\bnp\.load\("
    r"|(?<![.\w])(?<!def )(eval|exec)\("
  )
  hits = []
  for path in glob.glob(os.path.join(REPO, "transformer", "**", "*.py"), recursive=True):
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
      if unsafe.search(line):
        hits.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
  assert hits == []


# --------------------------------------------------------------------------------------
# Bad configs and overrides: one line naming the field, never a traceback.

_BASE = experiment.default_config().to_dict()
_NAN, _INF = float("nan"), float("inf")

# Field -> values its rule rejects (documented ranges and choices).
_OUT_OF_RANGE = {
  **{f: [0, -1] for f in ("num_train_steps", "batch_size", "seq_len", "grad_accum_steps")},
  **{f: [0, -3] for f in ("log_every", "checkpoint_every", "keep_checkpoints")},
  **{f: [-1] for f in ("eval_every", "eval_batches", "sample_tokens", "bleu_every")},
  "bleu_beam_size": [-1],
  "label_smoothing": [-0.1, 1.0, 7.5, _NAN, _INF],
  "z_loss": [-1e-4, -_INF],
  "parallelism": ["pjit", ""],
  "best_mode": ["lowest"],
  "sample_temperature": [0.0, -1.0, -_INF],
  "preemption_grace_seconds": [0.0, -5.0, _NAN, -_INF],
  "debug_inject_nan_at_step": [0, -2],
  "debug_inject_nan_in": ["params", ""],
  **{f"model.{f}": [0, -1] for f in ("d_model", "num_heads", "num_layers", "d_ff", "max_len")},
  "model.num_kv_heads": [0, -2, 3],
  "model.num_decoder_layers": [0],
  "model.sliding_window": [0, -4],
  "model.dropout_rate": [-0.1, 1.0, _NAN],
  "model.attention_dropout_rate": [1.5, _NAN],
  "model.norm_eps": [0.0, -1e-5],
  "model.num_classes": [-1],
  "model.type_vocab_size": [-2],
  **{
    f"model.{f}": ["bogus", ""]
    for f in ("family", "position", "norm", "norm_position", "activation", "attention_impl")
  },
  "model.dtype": ["float8", "int32"],
  "model.remat_policy": ["sometimes"],
  **{f"data.{f}": ["bogus"] for f in ("kind", "source", "tokenizer", "overlong", "spm_model_type")},
  "data.mask_rate": [0.0, 1.0, -0.5],
  "data.vocab_size": [15, 0],
  "data.image_size": [0, -3],
  "data.num_workers": [-1],
  "data.prefetch": [0],
  "data.crop_padding": [-2],
  "optimizer.kind": ["adam_bogus"],
  "optimizer.b1": [1.0, -0.1],
  "optimizer.b2": [1.5],
  "optimizer.eps": [0.0, -1e-8],
  "optimizer.weight_decay": [-0.01],
  "optimizer.clip_norm": [-1.0],
  "schedule.kind": ["linear"],
  "schedule.warmup_steps": [-1],
  "schedule.learning_rate": [0.0, -1e-3, _NAN],
  "mesh.data": [0, -2],
  "mesh.fsdp": [0],
  "mesh.tensor": [-3],
}

# Field type -> values of other types (ml_collections lets a Python config set them).
_WRONG_TYPE = {
  int: ["7", 2.5, 3.0, [1], True, None],
  float: ["0.5", [0.5], True, None],
  str: [3, 2.5, ["a"], True, None],
  bool: [1, 0, "true", 1.0, None],
}

# (changes, a field the message must name): each combination breaks a cross-field rule.
_INCOMPATIBLE = [
  ({"model.family": "encoder"}, "kind"),
  ({"model.family": "vit"}, "num_classes"),
  ({"model.family": "seq2seq"}, "kind"),
  ({"batch_size": 10, "grad_accum_steps": 4}, "grad_accum_steps"),
  ({"model.d_model": 130, "model.num_heads": 4}, "num_heads"),
  ({"model.d_model": 96, "model.num_heads": 6, "model.num_kv_heads": 4}, "num_kv_heads"),
  ({"parallelism": "pmap", "mesh.fsdp": 2, "mesh.data": 4}, "parallelism"),
  ({"data.kind": "image"}, "kind"),
  ({"data.kind": "seq2seq"}, "kind"),
  ({"data.kind": "classification", "model.family": "encoder"}, "kind"),
  ({"data.tokenizer": "none"}, "tokenizer"),
  ({"model.family": "encoder", "data.kind": "mlm", "model.num_classes": 3}, "num_classes"),
  ({"mesh.data": -1, "mesh.fsdp": -1}, "mesh"),
  ({"schedule.kind": "cosine", "schedule.warmup_steps": 5000}, "warmup_steps"),
]


def _loop_and_model_types() -> dict[str, type]:
  """Type of every top-level loop field and every non-optional model field."""
  types = {name: type(default) for name, (default, _) in experiment.LOOP_FIELDS.items()}
  hints = typing.get_type_hints(ModelConfig)
  for f in dataclasses.fields(ModelConfig):
    if hints[f.name] in (int, float, str, bool):
      types[f"model.{f.name}"] = hints[f.name]
  return types


_TYPES = _loop_and_model_types()


def _with(changes: dict) -> ml_collections.ConfigDict:
  """The default config with `changes` ({'a.b': value}) applied without type checks."""
  values = copy.deepcopy(_BASE)
  for key, value in changes.items():
    block, _, name = key.rpartition(".")
    (values[block] if block else values)[name] = value
  return ml_collections.ConfigDict(values, type_safe=False)


@st.composite
def _malformed(draw):
  """(config, names: the message must contain one of them)."""
  kind = draw(st.sampled_from(["range", "type", "unknown", "incompatible"]))
  if kind == "range":
    key = draw(st.sampled_from(sorted(_OUT_OF_RANGE)))
    return {key: draw(st.sampled_from(_OUT_OF_RANGE[key]))}, [key.rpartition(".")[2]]
  if kind == "type":
    key = draw(st.sampled_from(sorted(_TYPES)))
    return {key: draw(st.sampled_from(_WRONG_TYPE[_TYPES[key]]))}, [key.rpartition(".")[2]]
  if kind == "unknown":
    block = draw(st.sampled_from(["", "model.", "data.", "optimizer.", "schedule.", "mesh."]))
    name = draw(st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True))
    assume_new = name not in (_BASE[block[:-1]] if block else _BASE)
    key = f"{block}{name}" if assume_new else f"{block}{name}_x"
    return {key: draw(st.sampled_from([1, "x", 0.5, True]))}, [key.rpartition(".")[2]]
  changes, name = draw(st.sampled_from(_INCOMPATIBLE))
  return dict(changes), [name]


@settings(
  max_examples=300,
  derandomize=True,
  deadline=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_malformed())
def test_malformed_configs_fail_in_one_line_naming_the_field(case):
  changes, names = case
  with pytest.raises(ValueError) as error:
    train_lib.validate(_with(changes))
  message = str(error.value)
  assert "\n" not in message, message
  assert any(name in message for name in names), (changes, message)


def test_every_listed_bad_value_fails_in_one_line_naming_the_field():
  """The finite part of the space above, exhaustively: each listed out-of-range value, each
  wrong type of each loop and model field, each incompatible combination."""
  cases = [({k: v}, k) for k, values in _OUT_OF_RANGE.items() for v in values]
  cases += [({k: v}, k) for k, t in _TYPES.items() for v in _WRONG_TYPE[t]]
  cases += [(changes, name) for changes, name in _INCOMPATIBLE]
  bad = []
  for changes, key in cases:
    try:
      train_lib.validate(_with(changes))
      bad.append((changes, "accepted"))
    except ValueError as e:
      if "\n" in str(e) or key.rpartition(".")[2] not in str(e):
        bad.append((changes, str(e)))
  assert len(cases) > 400 and bad == []


# Validation gaps the search above once found (the data block was not type-checked, NaN
# passed `x < 0`, a ConfigDict value printed on several lines): each case must fail in one
# line naming the field.
@pytest.mark.parametrize(
  "changes",
  [
    pytest.param({"data.packing": "true"}, id="data.packing=str-accepted"),
    pytest.param({"data.image_size": 2.5}, id="data.image_size=float-accepted"),
    pytest.param({"data.eval_split": 3}, id="data.eval_split=int-accepted"),
    pytest.param({"data.num_workers": "7"}, id="data.num_workers=str-unnamed"),
    pytest.param({"model.num_kv_heads": True}, id="model.num_kv_heads=bool-accepted"),
    pytest.param({"z_loss": _NAN}, id="z_loss=nan-accepted"),
    pytest.param({"sample_temperature": _NAN}, id="sample_temperature=nan-accepted"),
    pytest.param({"batch_size": {"a": 1}}, id="batch_size=dict-two-lines"),
  ],
)
def test_known_validation_gaps(changes):
  (key,) = changes
  with pytest.raises(ValueError) as error:
    train_lib.validate(_with(changes))
  assert "\n" not in str(error.value) and key.rpartition(".")[2] in str(error.value)


_OVERRIDE_VALUES = ["abc", "-1", "0", "1.5", "nan", "-inf", "1e400", "maybe", "", "9" * 20]


def _override_fields() -> list[str]:
  fields = []
  for key, value in tiny_lm_config_file.get_config().items():
    if isinstance(value, ml_collections.ConfigDict):
      fields += [f"{key}.{k}" for k in value.keys()]
    else:
      fields.append(key)
  return sorted(fields)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # config_flags' module loader
@settings(max_examples=100, derandomize=True, deadline=None)
@given(
  st.sampled_from(_override_fields() + ["no_such_field", "model.no_such_field"]),
  st.sampled_from(_OVERRIDE_VALUES),
)
def test_bad_overrides_fail_in_one_line_naming_the_field(field, value):
  """The override path in process: absl + config_flags parsing (`cli.parse_flags`), then
  validation. Any failure is one line naming the overridden field; no other exception."""
  from absl import flags
  from ml_collections import config_flags

  from transformer import cli

  argv = [
    "train.py",
    f"--config={fh.TINY_CONFIG}",
    "--workdir=/unused",
    f"--config.{field}={value}",
  ]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True)
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  saved = flags.FLAGS, sys.argv
  flags.FLAGS, sys.argv = flag_values, argv  # config_flags reads the overrides from sys.argv
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr):
      cli.parse_flags(argv)
    message = None
  except SystemExit as e:
    assert e.code == 1
    (message,) = stderr.getvalue().strip().splitlines()
    assert message.startswith("error: ")
  finally:
    flags.FLAGS, sys.argv = saved
  if message is None:
    try:
      train_lib.validate(flag_values.config)
      return  # a valid override
    except ValueError as e:
      message = str(e)
  assert "\n" not in message
  assert field.rpartition(".")[2] in message, message


@pytest.mark.slow
def test_bad_overrides_on_the_command_line_are_one_line(tmp_path):
  cases = {
    "--config.batch_size=abc": "batch_size",  # wrong type
    "--config.model.d_model=-5": "d_model",  # out of range
    "--config.no_such_field=1": "no_such_field",  # unknown
    "--config.data.kind=image": "kind",  # incompatible with the char tokenizer
  }
  env = fh.child_env()
  procs = {
    flag: subprocess.Popen(
      fh.train_command(str(tmp_path / "w"), flag), env=env, stderr=subprocess.PIPE, text=True
    )
    for flag in cases
  }
  for flag, proc in procs.items():
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (flag, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and cases[flag] in last, (flag, last)
    assert "Traceback" not in err, err
  assert not os.path.exists(tmp_path / "w" / "checkpoints")  # failed before any work


# --------------------------------------------------------------------------------------
# Bad data: every builder and tokenizer reader fails naming the file (and line), or
# handles the input as documented. (tests/test_data_errors.py holds the other cases.)


def _write(path, data: bytes):
  path.write_bytes(data)
  return path


def _idx(array: np.ndarray) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  return header + array.astype(np.uint8).tobytes()


def _mnist_dir(root, images, labels, test_images=None):
  from transformer.data import image_builders

  root.mkdir()
  arrays = [images, labels, images if test_images is None else test_images, labels]
  for name, array in zip(image_builders.MNIST_FILES, arrays, strict=True):
    (root / name).write_bytes(gzip.compress(array if isinstance(array, bytes) else _idx(array)))
  return root


_TSV = "en\tes\n" + "".join(f"hello {i}\thola {i}\n" for i in range(40))
_CSV = "text,label\n" + "".join(f"text {i},{'pos' if i % 2 else 'neg'}\n" for i in range(40))


def _bad_inputs(tmp):
  """(name, callable, regex of the error): each input fails naming its file (and line)."""
  from transformer.data import builders, image_builders

  text = lambda p: builders.text_corpus(p, tmp / "tfds")
  pairs = lambda p: builders.sentence_pairs(p, ["en", "es"], tmp / "tfds")
  labelled = lambda p: builders.labelled_text(p, "text", "label", tmp / "tfds")
  idx = lambda p: image_builders.idx_images(p, tmp / "tfds")
  binary = bytes(range(128, 256)) * 20  # no valid UTF-8 start byte
  truncated = lambda s: gzip.compress(s.encode())[:-12]
  images = np.zeros((20, 4, 4), np.uint8)
  labels = np.arange(20) % 3
  w = lambda name, data: _write(tmp / name, data)
  test_size = np.zeros((20, 5, 5), np.uint8)
  return [
    ("text truncated gzip", text, w("a.txt.gz", truncated("line\n" * 99)), "not a valid gzip"),
    ("text binary", text, w("b.txt", binary), r":1: invalid UTF-8"),
    ("text empty gzip", text, w("c.txt.gz", gzip.compress(b"")), "empty corpus"),
    ("pairs truncated gzip", pairs, w("p.tsv.gz", truncated(_TSV)), "not a valid gzip"),
    ("pairs binary", pairs, w("p2.tsv", binary), r":1: invalid UTF-8"),
    ("pairs bad byte", pairs, w("p3.tsv", _TSV.encode() + b"caf\xe9\tx\n"), r":42: invalid UTF-8"),
    ("pairs header only", pairs, w("p4.tsv", b"en\tes\n"), "no data rows"),
    ("labelled truncated gzip", labelled, w("l.csv.gz", truncated(_CSV)), "not a valid gzip"),
    ("labelled binary", labelled, w("l2.csv", binary), r":1: invalid UTF-8"),
    ("labelled bad byte", labelled, w("l3.csv", _CSV.encode() + b"\xff,pos\n"), r":42: invalid"),
    (
      "labelled open quote",
      labelled,
      w("l4.csv", (_CSV + '"x,y\n' + _CSV).encode()),
      r":42: expected",
    ),
    ("idx empty", idx, _mnist_dir(tmp / "m1", b"", labels), r"idx3-ubyte.gz: not an IDX file"),
    ("idx label count", idx, _mnist_dir(tmp / "m2", images, labels[:7]), r"\(7,\) labels for 20"),
    ("idx 2-D images", idx, _mnist_dir(tmp / "m3", images.reshape(20, 16), labels), r"\[N, H, W\]"),
    ("idx test size", idx, _mnist_dir(tmp / "m4", images, labels, test_size), r"shape \(4, 4, 1\)"),
  ]


def test_bad_data_files_fail_naming_file_and_line(tmp_path):
  for name, build, path, pattern in _bad_inputs(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + pattern) as error:
      build(path)
    assert "\n" not in str(error.value), name


def test_huge_lines_and_binary_images(tmp_path):
  """A 1 MB line in a text corpus is cut into chunks (documented: `chunk_chars`); an image
  file that is not an image fails naming it."""
  from PIL import Image

  from transformer.data import builders, image_builders

  corpus = tmp_path / "huge.txt"
  corpus.write_text("x" * 1_000_000 + "\n" + "an ordinary line\n" * 30_000)
  builder = builders.text_corpus(corpus, tmp_path / "tfds")
  assert builder.info.splits["train"].num_examples > 1_000_000 // 16384
  for label in ("a", "b"):
    (tmp_path / "imgs" / label).mkdir(parents=True)
    for i in range(3):
      Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "imgs" / label / f"{i}.png")
  _write(tmp_path / "imgs" / "b" / "bad.png", bytes(range(256)) * 4)
  with pytest.raises(
    ValueError, match=re.escape(str(tmp_path / "imgs/b/bad.png")) + ": cannot read"
  ):
    image_builders.image_folder(tmp_path / "imgs", tmp_path / "tfds")


def test_table_field_over_csv_limit_names_file_and_line(tmp_path):
  from transformer.data import builders

  path = _write(tmp_path / "long.tsv", (_TSV + "a" * 200_000 + "\tb\n").encode())
  with pytest.raises(ValueError, match=re.escape(str(path)) + ":42"):
    builders.sentence_pairs(path, ["en", "es"], tmp_path / "tfds")


@pytest.mark.parametrize(
  ("name", "content"),
  [
    ("char_vocab.json", b""),
    ("char_vocab.json", bytes(range(128, 256))),
    ("char_vocab.json", b'{"kind": "char", "specials": ['),
    ("char_vocab.json", b"[1, 2]"),
    (
      "char_vocab.json",
      b'{"kind": "char", "specials": ["<pad>", "<bos>", "<eos>", "<unk>", '
      b'"[MASK]", "[CLS]", "[SEP]"]}',
    ),
    ("spm_unigram_64.model", bytes(range(256))),
    ("spm_unigram_64.model", b""),
  ],
  ids=["empty", "binary", "truncated", "list", "no-code-points", "spm-garbage", "spm-empty"],
)
def test_tokenizer_file_errors_name_the_file(tmp_path, name, content):
  path = _write(tmp_path / name, content)
  with pytest.raises(ValueError, match=re.escape(str(path))):
    load_tokenizer(path)
