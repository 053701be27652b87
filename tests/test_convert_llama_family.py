"""OLMo 2, Gemma 1 / 2 / 3, Qwen3 (QK-norm, head_dim apart from D / N), Qwen3-MoE and Mixtral
against `transformers`.

The tiny models follow tests/test_convert_hf.py (width 32, 2 layers, vocabulary 100,
perturbed norms and biases) and pass the same checks: logits on padded inputs in fp32 and
bf16, export that `from_pretrained` loads to the same logits, bit-identical re-import,
and greedy continuations equal to HF `generate`. The MoE models have 4 experts, top-2:
Mixtral renormalises the two gates, this Qwen3-MoE does not (`norm_topk_prob=False`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import test_convert_hf as parity  # its tiny sizes, inputs and checks
import transformers

from transformer import convert

V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
SHARED = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT)


def _qwen3():
  """head_dim 16 (D / N is 8), two KV heads, a tied head: Qwen3-0.6B's shape."""
  return transformers.Qwen3ForCausalLM(
    transformers.Qwen3Config(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=2, head_dim=16,
      max_position_embeddings=MAX_LEN, tie_word_embeddings=True, **SHARED,
    )
  )  # fmt: skip


def _qwen3_moe():
  return transformers.Qwen3MoeForCausalLM(
    transformers.Qwen3MoeConfig(
      vocab_size=V, intermediate_size=FFN, moe_intermediate_size=24, num_experts=4,
      num_experts_per_tok=2, norm_topk_prob=False, num_key_value_heads=2, head_dim=8,
      max_position_embeddings=MAX_LEN, **SHARED,
    )
  )  # fmt: skip


def _qwen2_moe():
  """Qwen2-MoE: q/k/v biases, 4 experts top-2 (not renormalised), a gated shared expert."""
  return transformers.Qwen2MoeForCausalLM(
    transformers.Qwen2MoeConfig(
      vocab_size=V, intermediate_size=FFN, moe_intermediate_size=24, num_experts=4,
      num_experts_per_tok=2, shared_expert_intermediate_size=40, num_key_value_heads=2,
      max_position_embeddings=MAX_LEN, **SHARED,
    )
  )  # fmt: skip


def _mixtral():
  return transformers.MixtralForCausalLM(
    transformers.MixtralConfig(
      vocab_size=V, intermediate_size=FFN, num_local_experts=4, num_experts_per_tok=2,
      num_key_value_heads=2, max_position_embeddings=MAX_LEN, **SHARED,
    )
  )  # fmt: skip


def _gemma():
  """Gemma 1: (1 + w) norms, embeddings * sqrt(D), tanh GeGLU, head_dim 16 > D / N, MQA."""
  return transformers.GemmaForCausalLM(
    transformers.GemmaConfig(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=1, head_dim=16,
      max_position_embeddings=MAX_LEN, **SHARED,
    )
  )  # fmt: skip


def _gemma2():
  """Gemma 2: sandwich norms, soft caps low enough to bind on these logits, a 3-key window
  on alternate layers, query_pre_attn_scalar other than head_dim."""
  return transformers.Gemma2ForCausalLM(
    transformers.Gemma2Config(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=2, head_dim=16,
      max_position_embeddings=MAX_LEN, sliding_window=3, query_pre_attn_scalar=12,
      attn_logit_softcapping=2.0, final_logit_softcapping=4.0, **SHARED,
    )
  )  # fmt: skip


def _gemma3():
  """Gemma 3: QK-norm, pattern LLG over 3 layers, local base 100, global base 1e4 with
  linear scaling 2."""
  shared = SHARED | {"num_hidden_layers": 3}
  rope = {
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
  }
  return transformers.Gemma3ForCausalLM(
    transformers.Gemma3TextConfig(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=1, head_dim=16,
      max_position_embeddings=MAX_LEN, sliding_window=2, query_pre_attn_scalar=16,
      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
      rope_parameters=rope, **shared,
    )
  )  # fmt: skip


def _olmo2():
  """OLMo 2: norms after the sublayers, QK-norm over whole projections, GQA."""
  return transformers.Olmo2ForCausalLM(
    transformers.Olmo2Config(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=2,
      max_position_embeddings=MAX_LEN, **SHARED,
    )
  )  # fmt: skip


BUILDERS = {
  "GemmaForCausalLM": _gemma,
  "Gemma2ForCausalLM": _gemma2,
  "Gemma3ForCausalLM": _gemma3,
  "Qwen3ForCausalLM": _qwen3,
  "Qwen3MoeForCausalLM": _qwen3_moe,
  "Qwen2MoeForCausalLM": _qwen2_moe,
  "MixtralForCausalLM": _mixtral,
  "Olmo2ForCausalLM": _olmo2,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return parity.saved_all(BUILDERS, 20, tmp_path_factory)


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(arch, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(arch, *checkpoints[arch], tmp_path / "export")


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_greedy_generation_matches_hf(arch, checkpoints):
  parity.check_greedy(*checkpoints[arch])


def test_configs_carry_the_options(checkpoints):
  qwen3 = convert.load(checkpoints["Qwen3ForCausalLM"][1])[0]
  assert qwen3.qk_norm and qwen3.head_dim == 16 and qwen3.tie_embeddings
  moe = convert.load(checkpoints["Qwen3MoeForCausalLM"][1])[0]
  assert (moe.moe_experts, moe.moe_top_k, moe.moe_norm_topk, moe.d_ff) == (4, 2, False, 24)
  assert moe.qk_norm and moe.moe_capacity_factor is None
  q2 = convert.load(checkpoints["Qwen2MoeForCausalLM"][1])[0]
  assert (q2.moe_experts, q2.moe_shared_d_ff, q2.moe_shared_gate, q2.qkv_biases) == (
    4,
    40,
    True,
    True,
  )
  mixtral = convert.load(checkpoints["MixtralForCausalLM"][1])[0]
  assert (mixtral.moe_experts, mixtral.moe_norm_topk, mixtral.qk_norm) == (4, True, False)
  gemma = convert.load(checkpoints["GemmaForCausalLM"][1])[0]
  assert gemma.norm_scale_plus_one and gemma.scale_embeddings and gemma.tie_embeddings
  assert (gemma.activation, gemma.head_dim, gemma.kv_heads) == ("geglu_tanh", 16, 1)
  g2 = convert.load(checkpoints["Gemma2ForCausalLM"][1])[0]
  assert (g2.norm_position, g2.local_global_pattern, g2.sliding_window) == ("sandwich", "LG", 3)
  assert (g2.attention_softcap, g2.logits_softcap, g2.attention_scale) == (2.0, 4.0, 12**-0.5)
  olmo2 = convert.load(checkpoints["Olmo2ForCausalLM"][1])[0]
  assert (olmo2.norm_position, olmo2.qk_norm, olmo2.qk_norm_over) == (
    "sublayer_post",
    True,
    "projection",
  )
  g3 = convert.load(checkpoints["Gemma3ForCausalLM"][1])[0]
  assert (g3.local_global_pattern, g3.rope_local_theta, g3.rope_theta) == ("LLG", 100.0, 1e4)
  assert (g3.rope_scaling, g3.qk_norm, g3.attention_scale) == ("linear", True, None)
  assert g3.attention_softcap is None and g3.logits_softcap is None


def test_the_gemma_options_matter(checkpoints):
  """Each Gemma 2 / 3 option changes the logits, so the parity above tests it."""
  for arch, changes in (
    ("Gemma2ForCausalLM", dict(attention_softcap=None)),
    ("Gemma2ForCausalLM", dict(logits_softcap=None)),
    ("Gemma2ForCausalLM", dict(local_global_pattern="L")),
    ("Gemma3ForCausalLM", dict(rope_local_theta=10_000.0)),
    ("Gemma3ForCausalLM", dict(local_global_pattern="LG")),
    ("Olmo2ForCausalLM", dict(norm_position="pre")),
  ):
    config, params = convert.load(checkpoints[arch][1])
    x = parity._inputs(arch)
    ours = parity._our_logits(arch, config, params, x)
    other = parity._our_logits(arch, config.replace(**changes), params, x)
    assert np.abs(ours - other).max() > 1e-3, (arch, changes)


@pytest.mark.parametrize(
  "arch, changes",
  [
    ("Qwen3MoeForCausalLM", dict(moe_norm_topk=True)),
    ("Qwen2MoeForCausalLM", dict(moe_shared_gate=False)),
  ],
)
def test_the_gates_matter(arch, changes, checkpoints):
  """The other gate normalisation, or the shared expert ungated, gives other logits, so
  the parity above tests them."""
  config, params = convert.load(checkpoints[arch][1])
  x = parity._inputs(arch)
  ours = parity._our_logits(arch, config, params, x)
  other = parity._our_logits(arch, config.replace(**changes), params, x)
  assert np.abs(ours - other).max() > 1e-2


@pytest.mark.parametrize(
  "arch, changes, message",
  [
    ("Qwen3MoeForCausalLM", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ("Qwen3MoeForCausalLM", {"mlp_only_layers": [0]}, "mlp_only_layers=[0]"),
    ("Qwen2MoeForCausalLM", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ("Qwen3ForCausalLM", {"attention_bias": True}, "attention_bias=True"),
    ("MixtralForCausalLM", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ("GemmaForCausalLM", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ("GemmaForCausalLM", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(arch, changes, message, checkpoints, tmp_path):
  bad = parity.edited(checkpoints[arch][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{arch}: {message} is not supported")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value)


def test_a_model_with_options_an_architecture_lacks_is_not_exported_as_it(checkpoints, tmp_path):
  """QK-norm or experts would be dropped by a Llama config.json: refused in one line."""
  qwen3, params = convert.load(checkpoints["Qwen3ForCausalLM"][1])
  with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express ModelConfig.qk_norm"):
    convert.save(tmp_path / "a", qwen3, params, "LlamaForCausalLM")
  olmo2, params = convert.load(checkpoints["Olmo2ForCausalLM"][1])
  with pytest.raises(ValueError, match=r"Qwen3ForCausalLM cannot express .*qk_norm_over"):
    convert.save(tmp_path / "o", olmo2.replace(norm_position="pre"), params, "Qwen3ForCausalLM")
  gemma, params = convert.load(checkpoints["GemmaForCausalLM"][1])
  with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express .*norm_scale_plus_one"):
    convert.save(tmp_path / "g", gemma, params, "LlamaForCausalLM")
  mixtral, params = convert.load(checkpoints["MixtralForCausalLM"][1])
  with pytest.raises(ValueError, match=r"MistralForCausalLM cannot express ModelConfig.moe_exp"):
    convert.save(tmp_path / "b", mixtral, params, "MistralForCausalLM")
