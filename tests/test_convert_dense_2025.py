"""The dense decoders of 2025-2026 against `transformers`: Granite (four multipliers),
SmolLM3 (NoPE layers), OLMo 3 (sliding-window layers, a RoPE per layer kind), GLM-4
(sandwich norms, partial RoPE on adjacent pairs), ERNIE 4.5 (RoPE on adjacent pairs,
biases) and StarCoder 2 (LayerNorms, plain GELU feed-forward, a window).

The tiny models and checks are tests/test_convert_hf.py's: logits on padded inputs in fp32
(1e-4) and bf16, export that `from_pretrained` loads to the same logits, bit-identical
re-import, and greedy continuations of left-padded prompts equal to HF `generate`.
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
import test_convert_hf as parity
import transformers

from transformer import convert

V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
SHARED = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT)
SIZES = dict(vocab_size=V, intermediate_size=FFN, max_position_embeddings=MAX_LEN)


def _granite():
  """Multipliers far enough from 1 that each one moves the logits; biases everywhere."""
  return transformers.GraniteForCausalLM(
    transformers.GraniteConfig(
      num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.5,
      attention_multiplier=0.3, logits_scaling=2.5, attention_bias=True, mlp_bias=True,
      **SIZES, **SHARED,
    )
  )  # fmt: skip


def _smollm3():
  """Four layers, NoPE on the second and fourth (interval 2), GQA, tied."""
  return transformers.SmolLM3ForCausalLM(
    transformers.SmolLM3Config(
      num_key_value_heads=2, no_rope_layer_interval=2, rope_theta=100.0,
      **SIZES, **(SHARED | {"num_hidden_layers": 4}),
    )
  )  # fmt: skip


def _olmo3():
  """Three layers LLG with a 3-key window, the local layers' base 100, the global layers'
  1e4 with linear scaling 2."""
  rope = {
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
  }
  types = ["sliding_attention", "sliding_attention", "full_attention"]
  return transformers.Olmo3ForCausalLM(
    transformers.Olmo3Config(
      num_key_value_heads=2, sliding_window=3, layer_types=types, rope_parameters=rope,
      **SIZES, **(SHARED | {"num_hidden_layers": 3}),
    )
  )  # fmt: skip


def _glm4():
  """RoPE on half of each 16-wide head, q/k/v biases, GQA."""
  return transformers.Glm4ForCausalLM(
    transformers.Glm4Config(num_key_value_heads=2, head_dim=16, **SIZES, **SHARED)
  )


def _ernie():
  return transformers.Ernie4_5ForCausalLM(
    transformers.Ernie4_5Config(
      num_key_value_heads=2, head_dim=8, use_bias=True, rope_theta=1000.0, **SIZES, **SHARED
    )
  )


def _starcoder2():
  return transformers.Starcoder2ForCausalLM(
    transformers.Starcoder2Config(num_key_value_heads=2, sliding_window=4, **SIZES, **SHARED)
  )


BUILDERS = {
  "GraniteForCausalLM": _granite,
  "SmolLM3ForCausalLM": _smollm3,
  "Olmo3ForCausalLM": _olmo3,
  "Glm4ForCausalLM": _glm4,
  "Ernie4_5ForCausalLM": _ernie,
  "Starcoder2ForCausalLM": _starcoder2,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return parity.saved_all(BUILDERS, 60, tmp_path_factory)


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(arch, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(arch, *checkpoints[arch], tmp_path / "export")


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_greedy_generation_matches_hf(arch, checkpoints):
  parity.check_greedy(*checkpoints[arch])


def test_configs_carry_the_options(checkpoints):
  def load(arch):
    return convert.load(checkpoints[arch][1])[0]

  g = load("GraniteForCausalLM")
  assert (g.embedding_multiplier, g.residual_multiplier, g.attention_scale) == (3.0, 0.5, 0.3)
  assert g.logits_multiplier == 1 / 2.5 and g.use_bias
  assert load("SmolLM3ForCausalLM").rope_pattern == "RN"
  o = load("Olmo3ForCausalLM")
  assert (o.local_global_pattern, o.sliding_window, o.rope_local_theta) == ("LLG", 3, 100.0)
  assert (o.rope_scaling, o.norm_position, o.qk_norm_over) == (
    "linear",
    "sublayer_post",
    "projection",
  )
  glm = load("Glm4ForCausalLM")
  assert (glm.rope_fraction, glm.norm_position, glm.qkv_biases, glm.use_bias) == (
    0.5, "sandwich", True, False,
  )  # fmt: skip
  assert load("Ernie4_5ForCausalLM").use_bias
  s = load("Starcoder2ForCausalLM")
  assert (s.norm, s.activation, s.sliding_window, s.use_bias) == ("layernorm", "gelu_tanh", 4, True)


@pytest.mark.parametrize(
  "arch, changes",
  [
    ("GraniteForCausalLM", dict(embedding_multiplier=1.0)),
    ("GraniteForCausalLM", dict(residual_multiplier=1.0)),
    ("GraniteForCausalLM", dict(logits_multiplier=1.0)),
    ("GraniteForCausalLM", dict(attention_scale=None)),
    ("SmolLM3ForCausalLM", dict(rope_pattern="")),
    ("Olmo3ForCausalLM", dict(rope_local_theta=None)),
    ("Olmo3ForCausalLM", dict(local_global_pattern="L")),
    ("Glm4ForCausalLM", dict(norm_position="pre")),
  ],
)
def test_the_options_matter(arch, changes, checkpoints):
  """Each new option changes the logits, so the parity above tests it."""
  config, params = convert.load(checkpoints[arch][1])
  x = parity._inputs(arch)
  ours = parity._our_logits(arch, config, params, x)
  if "norm_position" in changes:  # the sandwich's second norms have no place pre-LN
    params = {"params": _without_post_norms(params["params"])}
  other = parity._our_logits(arch, config.replace(**changes), params, x)
  assert np.abs(ours - other).max() > 1e-3, (arch, changes)


def _without_post_norms(tree):
  if not isinstance(tree, dict):
    return tree
  return {k: _without_post_norms(v) for k, v in tree.items() if not k.endswith("_norm_post")}


def test_the_adjacent_pair_reordering_matters(checkpoints):
  """With the query and key features left in the checkpoint's order, GLM-4's and ERNIE's
  logits are wrong: the parity above tests the reordering."""
  for arch in ("Glm4ForCausalLM", "Ernie4_5ForCausalLM"):
    config, params = convert.load(checkpoints[arch][1])
    h, r = config.head_dim, config.rope_dim
    back = np.argsort(np.r_[np.arange(0, r, 2), np.arange(1, r, 2), np.arange(r, h)])

    def unordered(path, x, back=back):
      names = [getattr(k, "key", "") for k in path]
      return x[..., back] if {"query", "key"} & set(names) else x

    x = parity._inputs(arch)
    ours = parity._our_logits(arch, config, params, x)
    other = parity._our_logits(arch, config, jax.tree_util.tree_map_with_path(unordered, params), x)
    assert np.abs(ours - other).max() > 1e-3, arch


@pytest.mark.parametrize(
  "arch, changes, message",
  [
    ("SmolLM3ForCausalLM", {"use_sliding_window": True}, "use_sliding_window=True"),
    ("SmolLM3ForCausalLM", {"no_rope_layers": [1, 0, 2, 1]}, "no_rope_layers=[1, 0, 2, 1]"),
    ("GraniteForCausalLM", {"mlp_bias": False}, "(attention_bias, mlp_bias)=(True, False)"),
    ("Olmo3ForCausalLM", {"layer_types": ["chunked_attention"] * 3}, "layer_types="),
    ("Starcoder2ForCausalLM", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ("Glm4ForCausalLM", {"rope_parameters": {"rope_type": "longrope"}}, "rope_type='longrope'"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(arch, changes, message, checkpoints, tmp_path):
  bad = parity.edited(checkpoints[arch][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{arch}: {message}")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value) and "is not supported" in str(e.value)


def test_olmo3_sliding_rope_other_than_default_is_refused(checkpoints, tmp_path):
  arch = "Olmo3ForCausalLM"
  config = json.loads((checkpoints[arch][1] / "config.json").read_text())
  rope = config["rope_parameters"] | {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}
  bad = parity.edited(checkpoints[arch][1], tmp_path / "bad", rope_parameters=rope)
  with pytest.raises(ValueError, match=re.escape("rope_type']='linear' is not supported")):
    convert.load(bad)


def test_a_granite_model_is_not_exported_as_llama(checkpoints, tmp_path):
  config, params = convert.load(checkpoints["GraniteForCausalLM"][1])
  with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express .*embedding_multiplier"):
    convert.save(tmp_path / "g", config, params, "LlamaForCausalLM")
