"""GPT-NeoX / Pythia (parallel residual, partial rotary, head-major fused q|k|v), Phi-3
(fused qkv and gate-up projections, partial rotary, a window) and GPT-2 with its
per-layer score scaling (`scale_attn_by_inverse_layer_idx`) against `transformers`.

The tiny models follow tests/test_convert_hf.py and pass the same checks: logits on padded
inputs in fp32 and bf16, export that `from_pretrained` loads to the same logits,
bit-identical re-import, greedy continuations equal to HF `generate`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_convert_hf as parity  # its tiny sizes, inputs and checks
import transformers

from transformer import convert

V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
SHARED = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT)


def _pythia():
  """Pythia's options: parallel residual, RoPE on a quarter of each head (2 of 8)."""
  return transformers.GPTNeoXForCausalLM(
    transformers.GPTNeoXConfig(
      vocab_size=V, intermediate_size=FFN, max_position_embeddings=MAX_LEN,
      rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
      **SHARED,
    )
  )  # fmt: skip


def _phi3():
  """Phi-4-mini's partial rotary (0.75: 6 of 8 features), GQA, and a 4-key window."""
  return transformers.Phi3ForCausalLM(
    transformers.Phi3Config(
      vocab_size=V, intermediate_size=FFN, num_key_value_heads=2, max_position_embeddings=MAX_LEN,
      rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75},
      sliding_window=4, **SHARED,
    )
  )  # fmt: skip


def _gpt2_inverse_layer():
  """GPT-2 with layer i's scores divided by i + 1 (3 layers, so the factors 1, 2, 3)."""
  return transformers.GPT2LMHeadModel(
    transformers.GPT2Config(
      vocab_size=V, n_embd=parity.WIDTH, n_layer=3, n_head=parity.HEADS, n_positions=MAX_LEN,
      scale_attn_by_inverse_layer_idx=True, bos_token_id=None, eos_token_id=None, **parity.INIT,
    )
  )  # fmt: skip


BUILDERS = {
  "GPTNeoXForCausalLM": _pythia,
  "Phi3ForCausalLM": _phi3,
  "GPT2LMHeadModel": _gpt2_inverse_layer,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return parity.saved_all(BUILDERS, 40, tmp_path_factory)


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(arch, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(arch, *checkpoints[arch], tmp_path / "export")


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_greedy_generation_matches_hf(arch, checkpoints):
  parity.check_greedy(*checkpoints[arch])


def test_configs_carry_the_options(checkpoints):
  neox = convert.load(checkpoints["GPTNeoXForCausalLM"][1])[0]
  assert neox.parallel_residual and (neox.rope_fraction, neox.rope_dim) == (0.25, 2)
  assert (neox.norm, neox.activation, neox.use_bias) == ("layernorm", "gelu", True)
  phi3 = convert.load(checkpoints["Phi3ForCausalLM"][1])[0]
  assert (phi3.rope_fraction, phi3.rope_dim, phi3.sliding_window, phi3.kv_heads) == (0.75, 6, 4, 2)


def test_gpt2_inverse_layer_scaling_is_read_and_matters(checkpoints):
  arch = "GPT2LMHeadModel"
  config, params = convert.load(checkpoints[arch][1])
  assert config.attention_scale_by_layer and config.attention_scale is None
  assert config.layer_config(2).attention_scale == config.head_dim**-0.5 / 3
  x = parity._inputs(arch)
  ours = parity._our_logits(arch, config, params, x)
  other = parity._our_logits(arch, config.replace(attention_scale_by_layer=False), params, x)
  assert np.abs(ours - other).max() > 1e-2


def test_sequential_gpt_neox_and_the_options_matter(checkpoints, tmp_path):
  """`use_parallel_residual=False` is the sequential pre-LN block; and changing either
  option of the imported Pythia changes its logits, so the parity above tests both."""
  torch_model, path = checkpoints["GPTNeoXForCausalLM"]
  sequential = transformers.GPTNeoXForCausalLM(
    transformers.GPTNeoXConfig.from_pretrained(path, use_parallel_residual=False)
  )
  sequential.load_state_dict(torch_model.state_dict())
  sequential.eval().save_pretrained(tmp_path / "sequential")
  parity.check_parity_and_round_trip(
    "GPTNeoXForCausalLM", sequential, tmp_path / "sequential", tmp_path / "export"
  )
  arch, x = "GPTNeoXForCausalLM", parity._inputs("GPTNeoXForCausalLM")
  config, params = convert.load(path)
  ours = parity._our_logits(arch, config, params, x)
  for change in (dict(parallel_residual=False), dict(rope_fraction=1.0)):
    other = parity._our_logits(arch, config.replace(**change), params, x)
    assert np.abs(ours - other).max() > 1e-2, change


def test_refusals_are_one_line(checkpoints, tmp_path):
  src = checkpoints["GPTNeoXForCausalLM"][1]
  bad = tmp_path / "bad"
  bad.mkdir()
  for f in src.iterdir():
    (bad / f.name).write_bytes(f.read_bytes())
  config = json.loads((src / "config.json").read_text())
  (bad / "config.json").write_text(json.dumps(config | {"attention_bias": False}))
  with pytest.raises(ValueError, match=r"GPTNeoXForCausalLM: attention_bias=False is not") as e:
    convert.load(bad)
  assert "\n" not in str(e.value)
  llama = json.loads((checkpoints["Phi3ForCausalLM"][1] / "config.json").read_text())
  llama["architectures"] = ["LlamaForCausalLM"]
  (bad / "config.json").write_text(json.dumps(llama))
  with pytest.raises(ValueError, match=r"LlamaForCausalLM: partial_rotary_factor=0.75 is not"):
    convert.load(bad)
  neox, params = convert.load(src)
  with pytest.raises(ValueError, match=r"GPT2LMHeadModel cannot express .*parallel_residual"):
    convert.save(
      tmp_path / "gpt2",
      neox.replace(position="learned", rope_fraction=1.0),
      params,
      "GPT2LMHeadModel",
    )
