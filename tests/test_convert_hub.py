"""`init_from='hf:ORG/NAME'` through the Hugging Face cache, offline.

The cache is laid out in a temporary folder as `huggingface_hub` writes it
(`models--ORG--NAME/snapshots/REVISION/` and `refs/main`), holding a tiny Llama saved by
`transformers`; `HF_HUB_OFFLINE=1`, so nothing is fetched. `hf:DIR` keeps reading the
directory.
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
import transformers

from transformer import convert
from transformer.convert import sources
from transformer.train import pretrained

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A tiny Llama checkpoint directory (with a tokenizer_config.json beside it)."""
  path = tmp_path_factory.mktemp("tiny_llama")
  config = transformers.LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, max_position_embeddings=32,
  )  # fmt: skip
  transformers.LlamaForCausalLM(config).save_pretrained(path)
  return path


def _cache(root, repo: str, src) -> None:
  """`src`'s files as the hub cache holds repository `repo` at REVISION."""
  folder = root / f"models--{repo.replace('/', '--')}"
  shutil.copytree(src, folder / "snapshots" / REVISION)
  (folder / "refs").mkdir()
  (folder / "refs" / "main").write_text(REVISION)


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_cached_repository_loads_offline(variable, tiny, tmp_path, monkeypatch):
  hub = tmp_path / "hub"
  _cache(hub, "tiny-org/tiny-llama", tiny)
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv(variable, str(hub if variable == "HF_HUB_CACHE" else tmp_path))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  name = f"hf:tiny-org/tiny-llama@{REVISION}" if variable == "HF_HOME" else "hf:tiny-org/tiny-llama"
  source, path = sources.find(name)
  assert source is sources.HF
  assert path == str(hub / "models--tiny-org--tiny-llama" / "snapshots" / REVISION)
  classes, params = source.load(path)
  want = convert.load(tiny)[1]["params"]
  assert classes == 0
  jax.tree.map(np.testing.assert_array_equal, params, want)
  record = pretrained.read_record(name, None)
  assert record["init_from"] == name and record["model"]["d_model"] == 16


def test_an_uncached_repository_offline_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(ValueError) as e:
    sources.find("hf:tiny-org/not-cached")
  message = str(e.value)
  assert message.startswith("hf:tiny-org/not-cached: no such directory, and not in the")
  assert str(tmp_path / "empty") in message and "hf download tiny-org/not-cached" in message
  assert "\n" not in message


def test_a_directory_is_read_as_it_is(tiny, monkeypatch, tmp_path):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  assert sources.find(f"hf:{tiny}") == (sources.HF, str(tiny))
  monkeypatch.chdir(tiny.parent)  # a relative ORG/NAME-like path that exists is a directory
  (tiny.parent / "org").mkdir(exist_ok=True)
  shutil.copytree(tiny, tiny.parent / "org" / "local", dirs_exist_ok=True)
  assert sources.find("hf:org/local") == (sources.HF, "org/local")
