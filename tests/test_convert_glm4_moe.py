"""GLM-4.5 (`Glm4MoeForCausalLM`) against `transformers`: dense first layers beside narrower
experts, DeepSeek-V3's router (sigmoid scores, a choice-only bias, group-limited top-k, a
routed scale), an ungated shared expert, partial RoPE, QK-norm and q/k/v biases.

The tiny models and checks are tests/test_convert_hf.py's: logits on padded inputs in fp32
(1e-4) and bf16, export that `from_pretrained` loads to the same logits, bit-identical
re-import, and greedy continuations of left-padded prompts equal to HF `generate`.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
import test_convert_hf as parity
import torch
import transformers

from transformer import convert

ARCH = "Glm4MoeForCausalLM"
V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
SHARED = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT)
SIZES = dict(vocab_size=V, intermediate_size=FFN, max_position_embeddings=MAX_LEN)


def with_choice_bias(model):
  """`model` (GLM-4.5's or DeepSeek-V3's layout) with a choice bias on each MoE layer large
  enough to change which experts are chosen (the checkpoints' own start at zero)."""
  with torch.no_grad():
    for layer in model.model.layers[model.config.first_k_dense_replace :]:
      layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
  return model


def _glm(**fields):
  config = transformers.Glm4MoeConfig(**SIZES, **SHARED | fields)
  return with_choice_bias(transformers.Glm4MoeForCausalLM(config))


def _grouped():
  """Three layers, the first dense (64 wide), then 8 experts 16 wide in 2 groups of which
  a token's top 1 is kept, top-2 renormalised and scaled 2.5, a shared expert twice as
  wide; QK-norm, q/k/v biases, RoPE on half of each head."""
  return _glm(
    num_hidden_layers=3, first_k_dense_replace=1, moe_intermediate_size=16, n_routed_experts=8,
    num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
    n_shared_experts=2, use_qk_norm=True, attention_bias=True, num_key_value_heads=2,
  )  # fmt: skip


def _ungrouped():
  """Every layer MoE, one group, top-3 not renormalised, no QK-norm or biases, MQA."""
  return _glm(
    first_k_dense_replace=0, moe_intermediate_size=24, n_routed_experts=4,
    num_experts_per_tok=3, norm_topk_prob=False, use_qk_norm=False, attention_bias=False,
    num_key_value_heads=1,
  )  # fmt: skip


BUILDERS = {"grouped": _grouped, "ungrouped": _ungrouped}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return parity.saved_all(BUILDERS, 90, tmp_path_factory)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(ARCH, *checkpoints[name], tmp_path / "export")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_greedy_generation_matches_hf(name, checkpoints):
  parity.check_greedy(*checkpoints[name])


def test_config_and_layers_carry_the_options(checkpoints):
  c, params = convert.load(checkpoints["grouped"][1])
  assert (c.d_ff, c.moe_d_ff, c.moe_first_dense, c.moe_shared_d_ff) == (FFN, 16, 1, 32)
  assert (c.moe_router, c.moe_selection_bias, c.moe_groups, c.moe_top_groups) == (
    "sigmoid",
    True,
    2,
    1,
  )
  assert (c.moe_routed_scale, c.moe_norm_topk, c.rope_dim, c.qk_norm) == (2.5, True, 4, True)
  assert (c.qkv_biases, c.use_bias, c.moe_shared_gate) == (True, False, False)
  decoder = params["params"]["decoder"]
  assert decoder["layer_0"]["ffn"]["wi_0"]["kernel"].shape == (parity.WIDTH, FFN)
  assert "moe" not in decoder["layer_0"]
  moe = decoder["layer_1"]["moe"]
  assert moe["wi_0"]["kernel"].shape == (8, parity.WIDTH, 16)
  assert moe["router"]["bias"].shape == (8,)
  assert moe["shared_ffn"]["wo"]["kernel"].shape == (32, parity.WIDTH)
  u = convert.load(checkpoints["ungrouped"][1])[0]
  assert (u.moe_first_dense, u.moe_groups, u.moe_norm_topk, u.qk_norm) == (0, 1, False, False)


@pytest.mark.parametrize(
  "changes",
  [dict(moe_routed_scale=1.0), dict(moe_top_groups=2), dict(moe_norm_topk=False), "no bias"],
)
def test_the_routing_options_matter(changes, checkpoints):
  """Each routing option, and the choice bias, changes the logits, so the parity above
  tests it."""
  config, params = convert.load(checkpoints["grouped"][1])
  x = parity._inputs(ARCH)
  ours = parity._our_logits(ARCH, config, params, x)
  other_config, other_params = config, params
  if changes == "no bias":  # the choice bias zeroed: the experts chosen by score alone

    def zero_bias(path, leaf):
      return (
        np.zeros_like(leaf)
        if jax.tree_util.keystr(path).endswith("['bias']")
        and ("router" in jax.tree_util.keystr(path))
        else leaf
      )

    other_params = jax.tree_util.tree_map_with_path(zero_bias, params)
  else:
    other_config = config.replace(**changes)
  other = parity._our_logits(ARCH, other_config, other_params, x)
  assert np.abs(ours - other).max() > 1e-2, changes


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"first_k_dense_replace": 3}, "first_k_dense_replace=3 is not supported (supported: 0 .. 2)"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(changes, message, checkpoints, tmp_path):
  bad = parity.edited(checkpoints["grouped"][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{ARCH}: {message}")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value)
