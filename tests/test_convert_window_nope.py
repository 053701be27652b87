"""Cohere 2 (parallel block with one LayerNorm, RoPE on its local layers only, logit
scale), EXAONE 4 (OLMo 2's norms with per-head QK-norm, NoPE global layers) and StableLM
(LayerNorms with biases, partial RoPE, per-head QK LayerNorm, parallel block) against
`transformers`, with the sizes and checks of tests/test_convert_dense_2025.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import test_convert_hf as parity
import transformers
from test_convert_dense_2025 import SHARED, SIZES

from transformer import convert

LLG = ["sliding_attention", "sliding_attention", "full_attention"]
THREE = SHARED | {"num_hidden_layers": 3}


def _cohere2():
  """Layers LLG with a 3-key window, GQA, a logit scale of 0.5."""
  return transformers.Cohere2ForCausalLM(
    transformers.Cohere2Config(
      num_key_value_heads=2, sliding_window=3, layer_types=LLG, logit_scale=0.5,
      rope_theta=100.0, **SIZES, **THREE,
    )
  )  # fmt: skip


def _exaone4():
  return transformers.Exaone4ForCausalLM(
    transformers.Exaone4Config(
      num_key_value_heads=2, sliding_window=3, layer_types=LLG, rope_theta=100.0,
      **SIZES, **THREE,
    )
  )  # fmt: skip


def _stablelm():
  """StableLM 2 12B's options: q/k/v biases, per-head QK LayerNorms, the parallel block,
  RoPE on a quarter of each head."""
  return transformers.StableLmForCausalLM(
    transformers.StableLmConfig(
      num_key_value_heads=2, use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True,
      **SIZES, **SHARED,
    )
  )  # fmt: skip


def _stablelm_sequential():
  """StableLM 2 1.6B / 3B-4E1T: sequential blocks, two LayerNorms, no QK-norm."""
  return transformers.StableLmForCausalLM(
    transformers.StableLmConfig(num_key_value_heads=4, use_qkv_bias=True, **SIZES, **SHARED)
  )


BUILDERS = {
  "Cohere2ForCausalLM": _cohere2,
  "Exaone4ForCausalLM": _exaone4,
  "StableLmForCausalLM": _stablelm,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  saved = parity.saved_all(BUILDERS, 70, tmp_path_factory)
  saved["sequential"] = parity.saved(_stablelm_sequential, 79, tmp_path_factory.mktemp("seq"))
  return saved


CASES = [*BUILDERS, "sequential"]


def _arch(name: str) -> str:
  return "StableLmForCausalLM" if name == "sequential" else name


@pytest.mark.parametrize("name", CASES)
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(_arch(name), *checkpoints[name], tmp_path / "export")


@pytest.mark.parametrize("name", CASES)
def test_greedy_generation_matches_hf(name, checkpoints):
  parity.check_greedy(*checkpoints[name])


def test_configs_carry_the_options(checkpoints):
  def load(name):
    return convert.load(checkpoints[name][1])[0]

  c = load("Cohere2ForCausalLM")
  assert (c.local_global_pattern, c.rope_pattern, c.sliding_window) == ("LLG", "RRN", 3)
  assert (c.norm, c.norm_bias, c.parallel_residual, c.parallel_shared_norm) == (
    "layernorm", False, True, True,
  )  # fmt: skip
  assert c.logits_multiplier == 0.5 and c.tie_embeddings
  e = load("Exaone4ForCausalLM")
  assert (e.local_global_pattern, e.rope_pattern, e.norm_position) == (
    "LLG",
    "RRN",
    "sublayer_post",
  )
  assert e.qk_norm and e.qk_norm_over == "head"
  s = load("StableLmForCausalLM")
  assert (s.rope_fraction, s.qk_norm_over, s.qkv_biases, s.parallel_shared_norm) == (
    0.25, "each_head", True, True,
  )  # fmt: skip
  seq = load("sequential")
  assert (seq.parallel_residual, seq.qk_norm, seq.norm, seq.norm_bias) == (
    False, False, "layernorm", True,
  )  # fmt: skip


@pytest.mark.parametrize(
  "name, changes",
  [
    ("Cohere2ForCausalLM", dict(rope_pattern="")),
    ("Cohere2ForCausalLM", dict(logits_multiplier=1.0)),
    ("Exaone4ForCausalLM", dict(rope_pattern="")),
    ("StableLmForCausalLM", dict(qk_norm=False)),
  ],
)
def test_the_options_matter(name, changes, checkpoints):
  """Each option changes the logits, so the parity above tests it."""
  arch = _arch(name)
  config, params = convert.load(checkpoints[name][1])
  x = parity._inputs(arch)
  ours = parity._our_logits(arch, config, params, x)
  if changes.get("qk_norm") is False:  # the per-head scales have no place without QK-norm
    params = _without(params, ("query_head_norm", "key_head_norm"))
  other = parity._our_logits(arch, config.replace(**changes), params, x)
  assert np.abs(ours - other).max() > 1e-3, (name, changes)


def _without(tree, names):
  if not isinstance(tree, dict):
    return tree
  return {k: _without(v, names) for k, v in tree.items() if k not in names}


@pytest.mark.parametrize(
  "name, changes, message",
  [
    ("Cohere2ForCausalLM", {"attention_bias": True}, "attention_bias=True"),
    ("Cohere2ForCausalLM", {"layer_types": ["chunked_attention"] * 3}, "layer_types="),
    ("Exaone4ForCausalLM", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("StableLmForCausalLM", {"rope_parameters": {"rope_type": "dynamic"}}, "rope_type='dynamic'"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(name, changes, message, checkpoints, tmp_path):
  arch = _arch(name)
  bad = parity.edited(checkpoints[name][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{arch}: {message}")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value) and "is not supported" in str(e.value)


def test_a_cohere2_model_is_not_exported_as_llama(checkpoints, tmp_path):
  config, params = convert.load(checkpoints["Cohere2ForCausalLM"][1])
  with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express .*"):
    convert.save(tmp_path / "c", config, params, "LlamaForCausalLM")
