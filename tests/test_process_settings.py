"""CPU process settings (`transformer/process_settings.py`): when they apply and what they set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
  from transformer.train.setup import compilation_cache_dir

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
