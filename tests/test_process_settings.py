"""CPU process settings (`transformer/process_settings.py`): when they apply and what they set;
the compilation cache every run uses (`train/compile_cache.py`); what `train.py` imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from session_env import PATIENCE_S

from transformer import process_settings


@pytest.mark.parametrize(
  "platforms, expected", [("cpu", True), ("CPU", True), ("cuda", False), ("cpu,tpu", False)]
)
def test_cpu_only_follows_jax_platforms(monkeypatch, platforms, expected):
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert process_settings.cpu_only() is expected


def test_off_and_accelerator_hosts_change_nothing(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  assert process_settings.apply("off") == []
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert process_settings.apply("auto") == []
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"


def test_bad_mode_names_the_flag():
  with pytest.raises(ValueError, match="--cpu_tuning must be one of"):
    process_settings.apply("fast")


def test_on_sets_allocator_and_flags_once():
  """In a fresh process: both settings applied, an existing vector-width flag respected."""
  code = (
    "import os\n"
    "from transformer import process_settings as p\n"
    "os.environ['JAX_PLATFORMS'] = 'cpu'\n"
    "os.environ['XLA_FLAGS'] = '--xla_cpu_multi_thread_eigen=true'\n"
    "print(p.apply('auto'))\n"
    "print(os.environ['XLA_FLAGS'])\n"
    "os.environ['XLA_FLAGS'] = '--xla_cpu_prefer_vector_width=256'\n"
    "print(p.apply('on'))\n"
    "import jax.numpy as jnp\n"
    "print(float(jnp.arange(4.0).sum()))\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True
  ).stdout.splitlines()
  assert out[0] == "['malloc: keep freed memory', '--xla_cpu_prefer_vector_width=512']"
  assert out[1] == "--xla_cpu_multi_thread_eigen=true --xla_cpu_prefer_vector_width=512"
  assert out[2] == "['malloc: keep freed memory']"  # the user's vector width stays
  assert out[3] == "6.0"  # JAX starts with the flags


def test_the_compilation_cache_is_on_by_default(monkeypatch, tmp_path):
  """'auto': the user's JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/transformer/jax,
  else ~/.cache/transformer/jax; '' is off; anything else is the folder itself."""
  from transformer.train import experiment
  from transformer.train.compile_cache import folder as compilation_cache_dir

  assert experiment.LoopConfig().compilation_cache_dir == "auto"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
  assert compilation_cache_dir("auto") == str(tmp_path / "env")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compilation_cache_dir("auto") == str(tmp_path / "xdg" / "transformer" / "jax")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compilation_cache_dir("auto") == str(tmp_path / "home" / ".cache" / "transformer" / "jax")
  assert compilation_cache_dir("") is None
  assert compilation_cache_dir("gs://bucket/jax") == "gs://bucket/jax"


def _train(workdir, cache) -> list[str]:
  """A tiny `train.py` run with its own compilation cache folder; its output lines."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [
    sys.executable,
    os.path.join(repo, "train.py"),
    f"--config={os.path.join(repo, 'tests', 'tiny_lm_config.py')}",
    f"--workdir={workdir}",
    "--config.num_train_steps=3",
    f"--config.compilation_cache_dir={cache}",
  ]
  out = subprocess.run(command, capture_output=True, text=True, timeout=PATIENCE_S)
  assert out.returncode == 0, out.stderr[-3000:]
  return (out.stdout + out.stderr).splitlines()


def _cache_line(lines: list[str], cache) -> tuple[int, int]:
  """(programs loaded, programs compiled) from the run's compilation cache line."""
  said = [line for line in lines if line.startswith(f"compilation cache {cache}: ")]
  assert len(said) == 1, lines[-20:]
  loaded, requested, compiled = map(int, re.findall(r"\d+", said[0].split(": ", 1)[1]))
  assert loaded + compiled == requested
  return loaded, compiled


def test_a_second_launch_compiles_nothing_and_a_corrupt_cache_warns_once(tmp_path):
  """Same config, same cache folder: the second process loads every program it needs and
  compiles none. Every entry then overwritten with garbage: the third run compiles them
  all again, says so in one warning line, and finishes."""
  cache = tmp_path / "cache"
  first = _cache_line(_train(tmp_path / "a", cache), cache)
  assert first[0] == 0 and first[1] >= 3  # a fresh folder: init, train and eval steps at least
  assert _cache_line(_train(tmp_path / "b", cache), cache) == (first[1], 0)
  entries = [p for p in cache.iterdir() if p.is_file() and not p.name.startswith(".")]
  assert len(entries) >= first[1]
  for entry in entries:
    entry.write_bytes(b"not an executable")
  lines = _train(tmp_path / "c", cache)
  assert _cache_line(lines, cache) == (0, first[1])
  warned = [line for line in lines if "cache" in line and "warning" in line.lower()]
  assert len(warned) == 1 and warned[0].startswith("warning: compilation cache: Error reading")


def test_an_unusable_cache_folder_is_one_warning_and_no_cache(tmp_path, capsys):
  """A file where the folder should be: one line naming it, and the run goes on uncached."""
  from transformer.train import compile_cache

  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert compile_cache.use(str(blocker / "jax")) is None
  said = capsys.readouterr().out.splitlines()
  assert len(said) == 1 and said[0].startswith(f"warning: compilation cache {blocker / 'jax'}")
  assert said[0].endswith("compiling without it")
  assert compile_cache.unusable(str(tmp_path / "new" / "jax")) is None  # made, then probed


def test_train_main_imports_no_heavy_library_it_does_not_use():
  """`import transformer.train_main` (what train.py runs first) loads neither PyTorch,
  TensorFlow, Hugging Face's libraries, Ray, Pallas's TPU kernels nor sacrebleu: a run that
  uses them imports them then."""
  heavy = ("torch", "tensorflow", "transformers", "datasets", "ray", "matplotlib", "lm_eval")
  heavy += ("jax.experimental.pallas.ops.tpu.splash_attention", "sacrebleu")
  code = (
    f"import sys, transformer.train_main\nprint(sorted(m for m in {heavy!r} if m in sys.modules))\n"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout
