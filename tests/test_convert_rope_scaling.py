"""Llama checkpoints with stretched RoPE frequencies (`rope_type` llama3, as every Llama 3.1 /
3.2 / 3.3 checkpoint has, and linear) against `transformers` itself, in and out.

The tiny models are those of tests/test_convert_hf.py (head_dim 8, RoPE base 500), with
the pretraining context L set to 16 so that, at the inputs' positions 0-9, the four
frequencies fall in all three llama3 bands: one wavelength (6.3) between L / 4 and L
(interpolated), three over L (divided by the factor). The frequencies are also checked
against a float64 NumPy transcription of Hugging Face's formula.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import test_convert_hf as parity  # its tiny sizes and its logits on padded inputs
import torch
import transformers

from transformer import convert
from transformer.nn.config import ModelConfig
from transformer.nn.positions import rope_frequencies
from transformer.nn.positions.rope import rope_attention_factor

ARCH = "LlamaForCausalLM"
LLAMA3 = {
  "rope_type": "llama3",
  "factor": 4.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 16,
}
LINEAR = {"rope_type": "linear", "factor": 2.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
YARN_GPT_OSS = {  # gpt-oss's form: an untruncated ramp, other betas, an explicit factor
  **YARN, "beta_fast": 8.0, "beta_slow": 0.5, "truncate": False, "attention_factor": 1.3,
}  # fmt: skip
YARN_DEEPSEEK = {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5}  # its attention factor


def _llama(rope: dict, seed: int):
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
    vocab_size=parity.VOCAB, intermediate_size=parity.FFN, num_key_value_heads=2,
    max_position_embeddings=parity.MAX_LEN, rope_parameters={"rope_theta": 500.0, **rope},
    bos_token_id=None, eos_token_id=None, pad_token_id=0, **parity.COMMON, **parity.INIT,
  )  # fmt: skip
  return transformers.LlamaForCausalLM(config).eval()


def _hf(model, x: dict) -> np.ndarray:
  return parity._real(ARCH, parity._hf_logits(ARCH, model, x), x)


def _ours(config: ModelConfig, params, x: dict) -> np.ndarray:
  return parity._real(ARCH, parity._our_logits(ARCH, config, params, x), x)


@pytest.mark.parametrize(
  "rope",
  [LLAMA3, LINEAR, YARN, YARN_GPT_OSS, YARN_DEEPSEEK],
  ids=["llama3", "linear", "yarn", "yarn-gpt-oss", "yarn-mscale"],
)
def test_scaled_rope_matches_hf_and_round_trips(rope, tmp_path):
  model = _llama(rope, seed=11)
  model.save_pretrained(tmp_path / "hf")
  x = parity._inputs(ARCH)
  want = _hf(model, x)

  config, params = convert.load(tmp_path / "hf")
  assert config.rope_scaling == rope["rope_type"]
  assert config.rope_scaling_factor == rope["factor"]
  if "attention_factor" in rope:
    assert config.rope_attention_factor == rope["attention_factor"]
  ours = _ours(config, params, x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  # The scaling shows in these logits: without it the same weights are far off.
  plain = _ours(config.replace(rope_scaling="none"), params, x)
  assert np.abs(plain - want).max() > 100 * 1e-4

  out = tmp_path / "export"
  convert.save(out, config, params, ARCH)
  reloaded = transformers.LlamaForCausalLM.from_pretrained(out).eval()
  assert reloaded.config.rope_parameters["rope_type"] == rope["rope_type"]
  np.testing.assert_allclose(_hf(reloaded, x), ours, atol=1e-4, rtol=0)
  config2, params2 = convert.load(out)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def _hf_llama3_reference(head_dim, theta, factor, low, high, context) -> np.ndarray:
  """`transformers.modeling_rope_utils._compute_llama3_parameters`, in float64 NumPy."""
  inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
  smooth = (context / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < context / high) & ~(wavelen > context / low)
  return np.where(medium, smoothed, scaled)


def test_llama3_frequencies_are_hugging_faces_in_every_band():
  """Llama 3.1 8B's settings (head_dim 128, base 500,000, factor 8, L 8192)."""
  config = ModelConfig(
    position="rope", d_model=128, num_heads=1, rope_theta=500_000.0, rope_scaling="llama3",
    rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
    rope_original_max_len=8192,
  )  # fmt: skip
  got = rope_frequencies(128, 500_000.0, config)
  want = _hf_llama3_reference(128, 500_000.0, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  plain = rope_frequencies(128, 500_000.0)
  wavelen = 2 * math.pi / plain
  kept, divided = wavelen < 8192 / 4, wavelen > 8192
  assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three bands
  np.testing.assert_array_equal(got[kept], plain[kept])
  np.testing.assert_allclose(got[divided], plain[divided] / 8.0, rtol=1e-15)


@pytest.mark.parametrize("rope", [YARN, YARN_GPT_OSS], ids=["yarn", "yarn-gpt-oss"])
def test_yarn_frequencies_and_attention_factor_are_hugging_faces(rope):
  """Against `transformers.modeling_rope_utils`' own YaRN, at Qwen-like sizes."""
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  hf = transformers.LlamaConfig(
    hidden_size=1024, num_attention_heads=8, max_position_embeddings=32_768,
    rope_parameters={"rope_theta": 1e6, **rope, "original_max_position_embeddings": 4096},
  )  # fmt: skip
  want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
  fields = convert.llama.rope_fields(hf.to_dict(), "LlamaForCausalLM")
  config = ModelConfig(position="rope", d_model=1024, num_heads=8, **fields)
  got = rope_frequencies(128, 1e6, config)
  np.testing.assert_allclose(got, want.double().numpy(), rtol=1e-6)  # HF's are float32
  assert rope_attention_factor(config) == pytest.approx(want_factor, rel=1e-12)
  plain = rope_frequencies(128, 1e6)
  assert np.any(got == plain) and np.any(np.isclose(got, plain / 4.0, rtol=1e-12))


def test_unknown_rope_type_and_missing_parameter_are_one_line(tmp_path):
  model = _llama(LINEAR, seed=12)
  model.save_pretrained(tmp_path / "hf")
  path = tmp_path / "hf" / "config.json"
  text = path.read_text()
  path.write_text(text.replace('"linear"', '"dynamic"'))
  with pytest.raises(ValueError, match=r"rope_type='dynamic'.*supported.*'yarn'") as e:
    convert.load(tmp_path / "hf")
  assert "\n" not in str(e.value)
  path.write_text(text.replace('"linear"', '"llama3"'))
  with pytest.raises(ValueError, match=r"rope_type='llama3' needs rope_parameters\['low_freq"):
    convert.load(tmp_path / "hf")
