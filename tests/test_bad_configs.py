"""Bad configs and overrides: malformed configs and overrides (hypothesis, and each listed
bad value exhaustively) end in one line naming the field, never a traceback."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import subprocess
import sys
import typing

import fault_harness as fh
import ml_collections
import pytest
import tiny_lm_config as tiny_lm_config_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from session_env import PATIENCE_S

from transformer import tasks
from transformer.nn.config import ModelConfig
from transformer.train import experiment, moved_fields

_BASE = experiment.default_config().to_dict()
_NAN, _INF = float("nan"), float("inf")

# Field -> values its rule rejects (documented ranges and choices).
_OUT_OF_RANGE = {
  **{f: [0, -1] for f in ("num_train_steps", "batch_size", "seq_len", "grad_accum_steps")},
  **{f: [0, -3] for f in ("log_every", "checkpoint_every", "keep_checkpoints")},
  **{f: [-1] for f in ("eval_every", "eval_batches")},
  "evaluate.sample.max_new_tokens": [-1],
  "evaluate.sample.temperature": [-1.0, -_INF, _NAN],
  "evaluate.sample.top_p": [0.0, 1.5, _NAN],
  "evaluate.sample.num_samples": [0],
  "evaluate.sample.past_context": ["bogus"],
  "evaluate.bleu.every": [-1],
  "evaluate.bleu.beam_size": [0, -1],
  **{f"evaluate.harness.{f}": [-1] for f in ("every", "limit", "num_fewshot")},
  "task.label_smoothing": [-0.1, 1.0, 7.5, _NAN, _INF],
  "task.z_loss": [-1e-4, -_INF, _INF],
  "parallelism": ["pjit", ""],
  "best_mode": ["lowest"],
  "preemption_grace_seconds": [0.0, -5.0, _NAN, -_INF],
  "distributed_timeout_s": [0, -1],
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
    for f in (
      "family",
      "position",
      "norm",
      "norm_position",
      "activation",
      "attention_impl",
      "context_attention",
    )
  },
  "model.dtype": ["float8", "int32"],
  "model.remat_policy": ["sometimes"],
  **{f"data.{f}": ["bogus"] for f in ("kind", "source", "tokenizer", "overlong", "spm_model_type")},
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
  "profile_steps": [(3,), (4, 2), (0, 1), (1, 2, 3), (1.0, 2)],
  "peak_flops": [-1.0, _INF, _NAN],
  "wandb.mode": ["cloud", ""],
}

# Field type -> values of other types (ml_collections lets a Python config set them).
_WRONG_TYPE = {
  int: ["7", 2.5, 3.0, [1], True, None],
  float: ["0.5", [0.5], True, None],
  str: [3, 2.5, ["a"], True, None],
  bool: [1, 0, "true", 1.0, None],
  tuple: ["1,2", 3, 2.5, True, None],
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
  ({"parallelism": "pmap", "mesh.context": 2}, "parallelism"),
  ({"mesh.context": 2, "model.attention_dropout_rate": 0.1}, "attention_dropout_rate"),
  ({"mesh.context": 0}, "context"),
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
  types = dict(experiment.top_level_fields())
  types |= {f"task.{f.name}": float for f in dataclasses.fields(tasks.CrossEntropyOptions)}
  hints = typing.get_type_hints(ModelConfig)
  for f in dataclasses.fields(ModelConfig):
    if hints[f.name] in (int, float, str, bool):
      types[f"model.{f.name}"] = hints[f.name]
  return types


_TYPES = _loop_and_model_types()


def _block(values: dict, path: str) -> dict:
  """The block at dotted `path` ('' = the top level, 'evaluate.sample') of `values`."""
  for key in filter(None, path.split(".")):
    values = values[key]
  return values


def _with(changes: dict) -> ml_collections.ConfigDict:
  """The default config with `changes` ({'a.b': value}) applied without type checks."""
  values = copy.deepcopy(_BASE)
  for key, value in changes.items():
    block, _, name = key.rpartition(".")
    _block(values, block)[name] = value
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
    block = draw(
      st.sampled_from(
        ["", "model.", "data.", "task.", "evaluate.", "evaluate.bleu.", "optimizer.", "schedule."]
        + ["mesh."]
      )
    )
    name = draw(st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True))
    assume_new = name not in _block(_BASE, block)
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
    experiment.validate(_with(changes))
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
      experiment.validate(_with(changes))
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
    pytest.param({"task.z_loss": _NAN}, id="z_loss=nan-accepted"),
    pytest.param({"evaluate.sample.temperature": _NAN}, id="temperature=nan-accepted"),
    pytest.param({"batch_size": {"a": 1}}, id="batch_size=dict-two-lines"),
  ],
)
def test_known_validation_gaps(changes):
  (key,) = changes
  with pytest.raises(ValueError) as error:
    experiment.validate(_with(changes))
  assert "\n" not in str(error.value) and key.rpartition(".")[2] in str(error.value)


@pytest.mark.parametrize(("old", "new"), sorted(moved_fields.MOVED.items()))
def test_a_field_set_at_its_old_place_names_its_new_one(old, new):
  with pytest.raises(ValueError) as error:
    experiment.validate(_with({old: 0.5}))
  assert str(error.value) == f"config.{old}=0.5: has moved: set config.{new}"


@pytest.mark.parametrize(
  ("changes", "message"),
  [
    ({"task.mask_rate": 1.0}, "config.task.mask_rate=1.0: must be in (0, 1)"),
    (
      {"task.mask_rte": 0.2},
      "config.task.mask_rte=0.2: unknown field; known: label_smoothing, "
      "mask_rate, whole_word_masking, z_loss",
    ),  # fmt: skip
    ({"task.whole_word_masking": 1}, "config.task.whole_word_masking=1: must be bool"),
  ],
)
def test_the_task_block_is_checked_against_the_options_of_the_configs_task(changes, message):
  mlm = {"data.kind": "mlm", "model.family": "encoder", "model.max_len": 128}
  with pytest.raises(ValueError) as error:
    experiment.validate(_with({**mlm, **changes}))
  assert str(error.value) == message


_OVERRIDE_VALUES = ["abc", "-1", "0", "1.5", "nan", "-inf", "1e400", "maybe", "", "9" * 20]


def _override_fields(block=None, prefix: str = "") -> list[str]:
  """Every field of the tiny config, dotted ('evaluate.sample.max_new_tokens')."""
  fields = []
  block = tiny_lm_config_file.get_config() if block is None else block
  for key, value in block.items():
    if isinstance(value, ml_collections.ConfigDict):
      fields += _override_fields(value, f"{prefix}{key}.")
    else:
      fields.append(f"{prefix}{key}")
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
      experiment.validate(flag_values.config)
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
    _, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 1, (flag, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and cases[flag] in last, (flag, last)
    assert "Traceback" not in err, err
  assert not os.path.exists(tmp_path / "w" / "checkpoints")  # failed before any work
