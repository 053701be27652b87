"""DeepSeek-V3 (`DeepseekV3ForCausalLM`, Kimi K2's architecture) against `transformers`:
multi-head latent attention (low-rank queries or one projection, values narrower than the
query heads, the rope features in adjacent pairs, YaRN with its softmax mscale) and
GLM-4.5's mixture of experts (dense first layers, sigmoid group-limited routing with its
choice bias, a shared expert).

The tiny models and checks are tests/test_convert_hf.py's: logits on padded inputs in fp32
(1e-4) and bf16, export that `from_pretrained` loads to the same logits, bit-identical
re-import, and greedy continuations of left-padded prompts, decoded from the latent cache,
equal to HF `generate`.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import test_convert_hf as parity
import transformers
from test_convert_glm4_moe import with_choice_bias

from transformer import convert

ARCH = "DeepseekV3ForCausalLM"
V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
SHARED = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT)
SIZES = dict(vocab_size=V, intermediate_size=FFN, max_position_embeddings=MAX_LEN)
MLA = dict(
  kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, num_key_value_heads=4
)


def _deepseek(**fields):
  config = transformers.DeepseekV3Config(**SIZES, **MLA, **(SHARED | fields))
  return with_choice_bias(transformers.DeepseekV3ForCausalLM(config))


def _grouped():
  """Three layers, the first dense; 8 experts 16 wide in 2 groups (top 1 kept), top-2
  renormalised, scaled 2.5, one shared expert; queries through a rank-16 latent."""
  return _deepseek(
    num_hidden_layers=3, first_k_dense_replace=1, moe_intermediate_size=16, n_routed_experts=8,
    num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
    n_shared_experts=1, q_lora_rank=16,
  )  # fmt: skip


def _yarn():
  """Every layer MoE (4 experts, one group), one query projection, YaRN x4 over a
  16-position original context with DeepSeek's mscale_all_dim."""
  rope = {
    "rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
    "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
    "beta_fast": 32.0, "beta_slow": 1.0,
  }  # fmt: skip
  return _deepseek(
    first_k_dense_replace=0, moe_intermediate_size=24, n_routed_experts=4, n_group=1,
    topk_group=1, num_experts_per_tok=2, q_lora_rank=None, rope_parameters=rope,
  )  # fmt: skip


BUILDERS = {"grouped": _grouped, "yarn": _yarn}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return parity.saved_all(BUILDERS, 110, tmp_path_factory)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(ARCH, *checkpoints[name], tmp_path / "export")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_greedy_generation_from_the_latent_cache_matches_hf(name, checkpoints):
  parity.check_greedy(*checkpoints[name])


def test_configs_carry_the_options(checkpoints):
  c, params = convert.load(checkpoints["grouped"][1])
  assert (c.mla_kv_rank, c.mla_q_rank, c.mla_rope_dim, c.mla_v_dim, c.head_dim) == (12, 16, 4, 6, 8)
  assert (c.moe_first_dense, c.moe_d_ff, c.moe_groups, c.moe_routed_scale) == (1, 16, 2, 2.5)
  attention = params["params"]["decoder"]["layer_0"]["self_attention"]
  assert attention["key_up"]["kernel"].shape == (12, 4, 8)
  assert attention["value_up"]["kernel"].shape == (12, 4, 6)
  assert attention["query_up"]["kernel"].shape == (16, 4, 12)
  y = convert.load(checkpoints["yarn"][1])[0]
  assert (y.mla_q_rank, y.rope_scaling, y.rope_scaling_factor) == (0, "yarn", 4.0)
  assert y.attention_scale == pytest.approx(12**-0.5 * (0.1 * np.log(4.0) + 1) ** 2)


def test_the_rope_order_matters(checkpoints):
  """Without reordering the rope features the logits differ: the parity above tests it."""
  config, params = convert.load(checkpoints["grouped"][1])
  x = parity._inputs(ARCH)
  ours = parity._our_logits(ARCH, config, params, x)
  attention = params["params"]["decoder"]["layer_1"]["self_attention"]
  kernel = np.asarray(attention["kv_down"]["kernel"])
  attention["kv_down"]["kernel"] = np.concatenate([kernel[:, :12], kernel[:, 12:][:, ::-1]], 1)
  other = parity._our_logits(ARCH, config, params, x)
  assert np.abs(ours - other).max() > 1e-3


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"attention_bias": True}, "attention_bias=True is not supported"),
    ({"rope_interleave": False}, "rope_interleave=False is not supported"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 is not supported"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace=3 is not supported (supported: 0 .. 2)"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(changes, message, checkpoints, tmp_path):
  bad = parity.edited(checkpoints["grouped"][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{ARCH}: {message}")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value)
