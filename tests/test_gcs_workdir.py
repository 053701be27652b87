"""`gs://` workdirs end to end, against a Cloud Storage emulator on loopback.

The emulator (`gcp-storage-emulator`, tests/fault_harness.py's `StorageEmulator`, its
objects in a temporary folder) is started on 127.0.0.1 by the module fixture and stopped
after the last test. Every storage layer is pointed at it:
`etils.epath` -> fsspec/gcsfs through `STORAGE_EMULATOR_HOST` (configs, metrics,
TensorBoard events, tokenizers, the lease, plots, evaluation outputs) and orbax ->
tensorstore's `gcs` kvstore through `TENSORSTORE_GCS_HTTP_URL` (checkpoint arrays).
docs/SCALING.md ("Object-storage workdirs") says what this does not cover.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import jax
import pytest
from fault_harness import (
  REPO,
  TINY_CONFIG,
  StorageEmulator,
  bit_equal,
  child_env,
  final_state,
  free_port,
  storage_env,
  train_command,
)
from session_env import PATIENCE_S

BUCKET = StorageEmulator.BUCKET
STEPS = ("--config.num_train_steps=6", "--config.checkpoint_every=3", "--config.log_every=2")
KILL_AT = 3  # the killed run stops right after checkpoint 3 is committed

# A training process that SIGKILLs itself once checkpoint KILL_AT is committed in the
# bucket: the kill lands at a known step, with the lease and the logs left as a crash
# leaves them.
_KILLED_TRAIN = textwrap.dedent(
  """
  import os, signal, sys, time
  sys.path.insert(0, {repo!r})
  from absl import app
  from etils import epath
  import train
  from transformer.cli import parse_flags
  from transformer.train.loop import Hooks

  def phase(name, step):
    print(f"phase {{name}} {{step}}", file=sys.stderr, flush=True)
    if name == "train" and step == {kill_at}:
      done = epath.Path({workdir!r}) / "checkpoints" / str(step) / "commit_success.txt"
      deadline = time.monotonic() + {patience}
      while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
      print(f"killing at {{step}}", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGKILL)

  train.HOOKS = Hooks(phase=phase)
  sys.argv = ["train.py", *sys.argv[1:]]
  app.run(train.main, flags_parser=parse_flags)
  """
)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
  """The emulator's URL; this process's storage clients point at it."""
  server = StorageEmulator(str(tmp_path_factory.mktemp("gcs")))
  try:
    server.start()
    for _ in range(50):  # bounded: the server answers within a few tries
      try:
        urllib.request.urlopen(server.endpoint + "/", timeout=2).close()
        break
      except OSError:
        time.sleep(0.1)
    mp = pytest.MonkeyPatch()
    for key, value in storage_env(server.endpoint).items():
      mp.setenv(key, value)
    mp.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    yield server.endpoint
    mp.undo()
  finally:
    server.stop()


def _env(endpoint: str) -> dict[str, str]:
  env = child_env()
  env.update(storage_env(endpoint))
  env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
  return env


def _run(
  cmd: list[str], env: dict[str, str], timeout: float = PATIENCE_S
) -> subprocess.CompletedProcess:
  return subprocess.run(
    cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
  )


def _train(workdir: str) -> list[str]:
  return train_command(workdir, *STEPS, script=os.path.join(REPO, "train.py"))


def _train_losses(jsonl_text: str) -> dict[int, float]:
  records = [json.loads(line) for line in jsonl_text.splitlines()]
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


@pytest.mark.slow
def test_gs_workdir_train_kill_resume_evaluate(emulator, tmp_path):
  """A run on gs:// killed after a checkpoint resumes to the parameters of an uninterrupted
  local run, bit for bit; every workdir file lands in the bucket; eval.py reads it back."""
  from etils import epath

  from transformer.data import files  # noqa: F401  (fresh listings: other processes write)

  temp = tmp_path / "temp"  # the runs' temporary directory: TensorBoard's staging folders
  temp.mkdir()
  env = {**_env(emulator), "TMPDIR": str(temp)}
  local = str(tmp_path / "local")
  ref = _run(_train(local), env)
  assert ref.returncode == 0, ref.stdout + ref.stderr

  url = f"gs://{BUCKET}/runs/tiny"
  script = _KILLED_TRAIN.format(repo=REPO, kill_at=KILL_AT, workdir=url, patience=PATIENCE_S)
  killed = _run([sys.executable, "-c", script, *_train(url)[2:]], env)
  assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
  assert f"killing at {KILL_AT}" in killed.stderr
  assert len(list(temp.glob("tensorboard-*"))) == 1  # the killed run's staging folder
  root = epath.Path(url)
  assert (root / "run.lock").exists()  # the crash left its lease behind
  lease = json.loads((root / "run.lock").read_text())
  assert lease["host"] == socket.gethostname() and "heartbeat" in lease

  resumed = _run(_train(url), env)
  out = resumed.stdout + resumed.stderr
  assert resumed.returncode == 0, out
  assert f"resumed from step {KILL_AT}" in out
  assert "took over the stale lease" in out
  assert not (root / "run.lock").exists()  # released at the end
  assert not list(temp.glob("tensorboard-*"))  # the killed run's removed, its own closed

  bad = bit_equal(final_state(local)["state"], final_state(url)["state"])
  assert final_state(url)["step"] == 6 and not bad, bad
  local_jsonl = (epath.Path(local) / "metrics.jsonl").read_text()
  gs_jsonl = (root / "metrics.jsonl").read_text()
  assert _train_losses(gs_jsonl) == _train_losses(local_jsonl)  # same steps, same losses
  names = {p.name for p in root.iterdir()}
  assert {"config.json", "model_config.json", "metrics.jsonl", "curves.png"} <= names, names
  assert len(list((root / "tensorboard").iterdir())) == 2  # one event file per run
  assert list((root / "tokenizers").glob("*/char_vocab.json"))
  assert not os.path.exists(os.path.join(REPO, "gs:"))  # nothing went to a local "gs:" folder

  evaluated = _run([sys.executable, os.path.join(REPO, "eval.py"), f"--workdir={url}"], env)
  assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
  result = json.loads((root / "eval_step_6.json").read_text())
  local_eval = [json.loads(line) for line in local_jsonl.splitlines()][-1]
  assert local_eval["split"] == "eval" and result["step"] == 6
  assert result["loss"] == pytest.approx(local_eval["loss"], rel=1e-6)


def test_lease_lock_on_object_storage(emulator, caplog):
  """The run lock on gs://: renewed while held, refuses a live or fresh owner naming it and
  the lease's age, takes over an expired or unreadable lease."""
  from etils import epath

  from transformer.train.guard.lock import LOCK_FILE, LeaseLock, run_lock

  url = f"gs://{BUCKET}/lease"
  path = epath.Path(url) / LOCK_FILE
  assert isinstance(run_lock(url), LeaseLock)
  fast = {"lease_s": 3.0, "heartbeat_s": 0.3, "settle_s": 0.1}
  with LeaseLock(url, **fast) as first:
    assert first.held
    beat = json.loads(path.read_text())["heartbeat"]
    time.sleep(1.2)
    assert json.loads(path.read_text())["heartbeat"] > beat  # renewed in the background
    with pytest.raises(RuntimeError, match=rf"in use by process {os.getpid()} on .*renewed"):
      LeaseLock(url, **fast).__enter__()  # this host, a live pid: refused
  assert not path.exists()

  other = {"owner": "elsewhere:7:abc", "host": "elsewhere", "pid": 7, "command": "python x"}
  path.write_text(json.dumps({**other, "started": time.time(), "heartbeat": time.time()}))
  with pytest.raises(RuntimeError, match=r"process 7 on elsewhere \(python x\).*renewed 0s ago"):
    LeaseLock(url, **fast).__enter__()
  assert json.loads(path.read_text())["owner"] == "elsewhere:7:abc"  # left alone

  path.write_text(json.dumps({**other, "started": 0.0, "heartbeat": time.time() - 10}))
  with LeaseLock(url, **fast) as taken:
    assert taken.held and json.loads(path.read_text())["pid"] == os.getpid()
  assert "took over the stale lease" in caplog.text and "renewed 10s ago" in caplog.text
  path.write_text("{not json")  # written whole or not at all, so unreadable means garbage
  with LeaseLock(url, **fast) as taken:
    assert taken.held
  assert not path.exists()


def test_unwritable_or_unreachable_gs_workdir_is_one_line(emulator, tmp_path):
  """A missing bucket or a storage endpoint nobody listens on: train.py exits 1 with one
  line naming the workdir and the storage error, before building anything."""
  traced = os.path.join(REPO, "tests", "traced_train.py")
  cmd = [sys.executable, traced, f"--config={TINY_CONFIG}"]
  env = _env(emulator)
  dead = _env(f"http://127.0.0.1:{free_port()}")
  runs = {  # the unreachable one retries for about half a minute: both run at once
    "missing bucket": (subprocess.Popen(
      [*cmd, "--workdir=gs://no-such-bucket/run"], env=env, cwd=REPO, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE), "gs://no-such-bucket/run",
      "no such bucket"),
    "unreachable": (subprocess.Popen(
      [*cmd, f"--workdir=gs://{BUCKET}/run"], env=dead, cwd=REPO, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE), f"gs://{BUCKET}/run",
      "Cannot connect to host 127.0.0.1"),
  }  # fmt: skip
  for what, (proc, url, reason) in runs.items():
    stdout, stderr = proc.communicate(timeout=PATIENCE_S)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, (what, stdout, stderr)
    assert lines and lines[-1].startswith(f"error: workdir {url} is not writable: "), stderr
    assert reason in lines[-1], (what, lines[-1])
    assert "Traceback" not in stderr and "phase build" not in stderr, (what, stderr)


def test_sharded_bf16_checkpoint_loads_from_object_storage(emulator, tmp_path):
  """A Hugging Face directory in gs://, bf16 and in several shards, read tensor by tensor:
  the same parameters as the local copy, each the float32 of the bf16 weight."""
  import numpy as np
  import torch
  import transformers
  from etils import epath

  from transformer import convert

  config = transformers.LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, max_position_embeddings=32,
  )  # fmt: skip
  model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
  local = tmp_path / "llama"
  model.save_pretrained(local, max_shard_size="4KB")
  assert len(list(local.glob("model-*.safetensors"))) > 1
  remote = epath.Path(f"gs://{BUCKET}/hf/llama")
  for f in local.iterdir():
    (remote / f.name).write_bytes(f.read_bytes())
  got_config, got = convert.load(str(remote))
  want_config, want = convert.load(local)
  assert got_config == want_config
  flat = lambda p: dict(jax.tree_util.tree_leaves_with_path(p))  # noqa: E731
  for (key, value), (_, expected) in zip(flat(got).items(), flat(want).items(), strict=True):
    np.testing.assert_array_equal(value, expected, err_msg=str(key))
  embed = model.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(got["params"]["token_embed"]["embedding"], embed)


def test_a_parquet_folder_on_object_storage_reads_as_the_local_one(emulator, tmp_path, monkeypatch):
  """data.source='hf' with a gs:// folder: listed and fetched through gcsfs into the local
  `datasets` cache, the same records as the shipped folder it was copied from. `datasets`
  fetches nothing remote while offline (the test session's setting): one line says so."""
  import datasets
  from etils import epath

  from transformer.data import DataConfig, sources

  local = os.path.join(REPO, "data", "shakespeare_speeches")
  remote = epath.Path(f"gs://{BUCKET}/speeches")
  for name in sorted(os.listdir(local)):
    (remote / name).write_bytes(open(os.path.join(local, name), "rb").read())
  cfg = DataConfig(source="hf", path=local, data_dir=str(tmp_path / "cache"))
  want = sources.open_splits(cfg)
  on_storage = cfg.replace(path=str(remote), data_dir=str(tmp_path / "cache2"))
  with pytest.raises(ConnectionError, match="reads no remote files while HF_DATASETS_OFFLINE"):
    sources.open_splits(on_storage)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
  got = sources.open_splits(on_storage)
  for a, b in ((want.train, got.train), (want.eval, got.eval)):
    assert len(a) == len(b) and list(a) == list(b)
