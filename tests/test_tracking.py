"""Experiment tracking and what the loop reports at start: W&B offline files and a resume
into the same W&B run, the online fallback without a network, TensorBoard hparams and
text, the profiler window, MFU and the compiled memory, the parameter overview.

One tiny run serves most checks: 4 updates with W&B offline, a profile of updates 2-3, a
forced peak of 1 GFLOP/s per device (the CPU has no table entry) and an 8-token sample,
then resumed in the same workdir for 2 more updates.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import json
import os
import re
import shutil
import struct
import sys

import jax
import pytest
import wandb
from conftest import tensorboard_events
from fault_runs import tiny_lm_config

from transformer.nn.models import flops_per_token, param_count
from transformer.train import loop as train_lib
from transformer.train import setup, tracking
from transformer.train.experiment import WandbConfig

PEAK = 1e9  # FLOP/s per device, forced


def _wandb_env(mp: pytest.MonkeyPatch, root: str) -> None:
  """W&B's own folders in the test's tmp, no inherited mode or credentials, and a server
  URL on a closed loopback port, so nothing can leave the machine. W&B reads the
  environment once per process: its state is torn down so the next run reads this one."""
  for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_DIR"):
    mp.delenv(name, raising=False)
  mp.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
  for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
    mp.setenv(name, os.path.join(root, name.lower()))
  wandb.teardown()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
  """{'workdir', 'first': stdout of the 4-update run, 'second': stdout of its resume}."""
  root = str(tmp_path_factory.mktemp("tracked"))
  workdir = os.path.join(root, "run")
  changes = {
    "wandb.mode": "offline",
    "wandb.tags": ("tiny",),
    "profile_steps": (2, 3),
    "peak_flops": PEAK,
    "evaluate.sample.max_new_tokens": 8,
  }
  out = {}
  with pytest.MonkeyPatch.context() as mp:
    _wandb_env(mp, root)
    for name, steps in (("first", 4), ("second", 6)):
      buffer = io.StringIO()
      with contextlib.redirect_stdout(buffer):
        train_lib.train_and_evaluate(tiny_lm_config(num_train_steps=steps, **changes), workdir)
      out[name] = buffer.getvalue()
    wandb.teardown()  # waits for W&B's service to finish writing the run files
  return {"workdir": workdir, **out}


def _wandb_records(path: str):
  """The records of a W&B run file: a ':W&B' header, then LevelDB-log chunks (32 KiB
  blocks; 7-byte chunk headers: crc, length, type) holding `wandb.proto` Records."""
  from wandb.proto import wandb_internal_pb2

  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B"
  pos, block, chunks = 7, 32768, []
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    chunks.append(data[pos + 7 : pos + 7 + length])
    pos += 7 + length
    if kind in (1, 4):  # FULL, LAST
      record = wandb_internal_pb2.Record()
      record.ParseFromString(b"".join(chunks))
      chunks = []
      yield record


def _history(path: str) -> tuple[set[str], dict[int, dict[str, float]]]:
  """(run ids, {step: {key: value}}) of a W&B run file."""
  ids, steps = set(), {}
  for record in _wandb_records(path):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      ids.add(record.run.run_id)
    elif kind == "history":
      items = {
        i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
      }
      steps.setdefault(int(items["_step"]), {}).update(items)
  return ids, steps


def test_offline_run_writes_its_files_and_a_resume_logs_into_the_same_run(tracked):
  workdir = tracked["workdir"]
  with open(os.path.join(workdir, tracking.RUN_ID_FILE)) as f:
    run_id = f.read().strip()
  assert re.fullmatch(r"[a-z0-9]{8}", run_id)
  runs = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*")))
  assert len(runs) == 2 and all(r.endswith(f"-{run_id}") for r in runs), runs  # one id
  first_ids, first = _history(os.path.join(runs[0], f"run-{run_id}.wandb"))
  second_ids, second = _history(os.path.join(runs[1], f"run-{run_id}.wandb"))
  assert first_ids == second_ids == {run_id}
  assert sorted(first) == [1, 2, 3, 4] and sorted(second) == [5, 6]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  for step, logged in (first | second).items():  # every metric, as in metrics.jsonl
    train = next(r for r in records if r["step"] == step and r["split"] == "train")
    for name in ("loss", "learning_rate", "grad_norm", "tokens_per_sec", "mfu"):
      assert logged[f"train/{name}"] == pytest.approx(train[name], rel=1e-6)
  eval_4 = next(r for r in records if r["step"] == 4 and r["split"] == "eval")
  assert first[4]["eval/loss"] == pytest.approx(eval_4["loss"], rel=1e-6)
  assert "eval/loss" in second[6]
  assert "wandb: run " + run_id + " (offline)" in tracked["second"]


def test_online_without_a_network_warns_and_logs_offline(tmp_path, monkeypatch, capsys):
  """A key but no reachable server (a closed loopback port): a one-line warning, then an
  offline run in the workdir; never an exception."""
  _wandb_env(monkeypatch, str(tmp_path))
  monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # read by the next wandb.init
  monkeypatch.setattr(tracking, "INIT_TIMEOUT_SECONDS", 3.0)
  workdir = str(tmp_path / "run")
  tracker = tracking.WandbTracker.start(WandbConfig(mode="online"), workdir, {"a": 1}, True)
  assert tracker is not None and tracker.mode == "offline"
  tracker.log(1, {"loss": 2.5}, "train")
  tracker.close()
  wandb.teardown()  # waits for W&B's service to finish writing the run files
  warning = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: wandb")]
  assert len(warning) == 1 and "logging offline" in warning[0], warning
  (run,) = glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{tracker.id}"))
  _, steps = _history(os.path.join(run, f"run-{tracker.id}.wandb"))
  assert steps[1]["train/loss"] == 2.5
  # Only process 0 tracks; 'disabled' starts nothing.
  assert tracking.WandbTracker.start(WandbConfig(mode="offline"), workdir, {}, False) is None
  assert tracking.WandbTracker.start(WandbConfig(), workdir, {}, True) is None


def test_wandb_without_the_package_is_a_one_line_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  with pytest.raises(ValueError, match=r"^config.wandb.mode='offline' needs the wandb package"):
    tracking.check_available(WandbConfig(mode="offline"))
  tracking.check_available(WandbConfig())  # disabled: no import


def test_profile_window_writes_a_trace_of_exactly_its_updates(tracked):
  sessions = glob.glob(os.path.join(tracked["workdir"], "plugins", "profile", "*"))
  assert len(sessions) == 1  # the resumed run starts past the window: no second trace
  assert glob.glob(os.path.join(sessions[0], "*.xplane.pb"))  # what TensorBoard reads
  (trace,) = glob.glob(os.path.join(sessions[0], "*.trace.json.gz"))
  with gzip.open(trace, "rb") as f:
    text = f.read()
  # One execution of the train step program per traced update (2 and 3).
  assert text.count(b'"CommonPjRtLoadedExecutable::Execute (jit_update)"') == 2
  assert "profile of updates 2-3 -> " in tracked["first"]
  assert "profile_steps=(2, 3): starts before update 5; no trace" in tracked["second"]


def test_start_report_and_console_lines_mfu_memory_and_overview(tracked):
  workdir, out = tracked["workdir"], tracked["first"]
  model_cfg = setup.load_model_config(workdir)
  assert f"total: {param_count(model_cfg):,} parameters" in out
  memory = re.search(r"compiled train step, memory per device: arguments ([\d.]+) MiB", out)
  assert memory and float(memory.group(1)) > 0 and "temporaries" in out
  assert f"MFU against {jax.device_count()} x 1 GFLOP/s (config.peak_flops)" in out
  lines = [x for x in out.splitlines() if re.match(r"step \d+/4 \|", x)]
  assert len(lines) == 4 and all(" | MFU " in x and "grad_norm" not in x for x in lines)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    train = [r for r in map(json.loads, f) if r["split"] == "train"]
  per_token = flops_per_token(model_cfg, 16)  # seq_len 16, every row full (text windows)
  for r in train:
    want = per_token * r["tokens_per_sec"] / (PEAK * jax.device_count())
    assert r["mfu"] == pytest.approx(want, rel=1e-9)
    assert f"step {r['step']}/" in out + tracked["second"]
  shown = re.search(r"step 4/4 \| .* \| MFU ([\d.]+)%", out)
  assert float(shown.group(1)) == pytest.approx(100 * train[3]["mfu"], abs=0.051)


def _tensorboard_summaries(logdir: str) -> list:
  return [(event.step, v) for event in tensorboard_events(logdir) for v in event.summary.value]


def test_tensorboard_gets_the_config_as_hparams_and_the_sample_as_text(tracked):
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

  values = _tensorboard_summaries(os.path.join(tracked["workdir"], "tensorboard"))
  starts = [v for _, v in values if v.tag == "_hparams_/session_start_info"]
  assert len(starts) == 2  # each start of the run
  hparams = HParamsPluginData.FromString(starts[-1].metadata.plugin_data.content)
  recorded = hparams.session_start_info.hparams
  assert recorded["num_train_steps"].number_value == 6
  assert recorded["model.d_model"].number_value == 32
  assert recorded["wandb.mode"].string_value == "offline"
  assert recorded["profile_steps"].string_value == "(2, 3)"
  texts = [(s, v) for s, v in values if v.tag == "sample/text_summary"]
  assert [s for s, _ in texts] == [4, 6]
  logged = texts[-1][1].tensor.string_val[0].decode()
  printed = tracked["second"].split("--- sample (8 tokens, temperature 0.8) ---\n")[1]
  printed = printed[: printed.rindex("\ncompilation cache ")]  # the run's last line follows
  assert logged == "\n".join("    " + line for line in printed.split("\n"))  # a code block


def test_lm_eval_scores_go_to_the_runs_own_wandb_run(tracked, tmp_path):
  """`python -m transformer.lm_eval` on a run that logs to W&B: the scores join that run
  (its id, resumed), as `lm_eval/TASK/METRIC` at the checkpoint's step."""
  from transformer import lm_eval

  workdir = tmp_path / "run"
  shutil.copytree(tracked["workdir"], workdir)
  with open(workdir / tracking.RUN_ID_FILE) as f:
    run_id = f.read().strip()
  with pytest.MonkeyPatch.context() as mp:
    _wandb_env(mp, str(tmp_path))
    results = lm_eval.main(["--workdir", str(workdir), "--tasks", "shakespeare_continuation",
                            "--limit", "4"])  # fmt: skip
    wandb.teardown()
  runs = sorted(glob.glob(str(workdir / "wandb" / "offline-run-*")))
  assert len(runs) == 3 and runs[-1].endswith(f"-{run_id}")
  ids, history = _history(os.path.join(runs[-1], f"run-{run_id}.wandb"))
  assert ids == {run_id}
  acc = results["results"]["shakespeare_continuation"]["acc,none"]
  assert history[6]["lm_eval/shakespeare_continuation/acc"] == pytest.approx(acc)
