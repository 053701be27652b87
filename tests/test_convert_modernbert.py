"""ModernBERT (`ModernBertForMaskedLM`, `ModernBertForSequenceClassification`) against
`transformers`.

Tiny random models built with transformers' own classes (width 32, 4 heads, 3 layers,
feed-forward 48, vocabulary 100; norms and biases perturbed as tests/test_convert_hf.py's
`saved` does): a global layer then two local ones ('GLL'), or alternating ('GL'), windows
of `local_attention` 4 or 6 (|t - s| <= 2 or 3) over inputs of 12 tokens so the band
shows, with and without biases, tied and untied, the exact and tanh GeGLU, [CLS] and mean
pooling. On padded inputs (right and left padding, the attention mask as `segment_ids`)
they pass tests/test_convert_hf.py's checks: fp32 logits to 1e-4, bf16 to 2e-2 of the
largest logit (or 1.25 times HF's own bf16 error), export that `from_pretrained` loads to
the same logits, bit-identical re-import. The window's width and the local RoPE base are
shown to matter, a 4.x config.json to read as transformers 5 reads it, and the options we
lack to be refused in one line.
"""

from __future__ import annotations

import copy
import json
import re

import jax
import numpy as np
import pytest
import test_convert_hf as parity  # its `saved`
import torch
import transformers

from transformer import convert
from transformer.convert import hf, modernbert
from transformer.nn.models import build_model

MLM, CLASSIFIER = modernbert.MLM, modernbert.CLASSIFIER
V, B, T = 100, 3, 12  # vocabulary; batch and length of the inputs (longer than the windows)


def _config(**extra):
  """ModernBERT's defaults (no biases, GeGLU, a global layer every third, RoPE bases
  160000 / 10000) at tiny sizes; PAD 0 and no other special ids in this vocabulary."""
  return transformers.ModernBertConfig(**{
    "vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
    "num_attention_heads": 4, "max_position_embeddings": 64, "local_attention": 4,
    "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None, "cls_token_id": None,
    "sep_token_id": None, "initializer_range": 0.1, **extra,
  })  # fmt: skip


# Biases everywhere, the head's dense included, none on the (untied) decoder; tanh GeGLU;
# alternating layers, a window of |t - s| <= 3, RoPE bases 500 / 5.
BIASED = dict(
  attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True, decoder_bias=False,
  tie_word_embeddings=False, hidden_activation="gelu_pytorch_tanh",
  global_attn_every_n_layers=2, local_attention=6, global_rope_theta=500.0,
  local_rope_theta=5.0,
)  # fmt: skip

# name -> (architecture, builder).
BUILDERS = {
  "mlm": (MLM, lambda: transformers.ModernBertForMaskedLM(_config())),
  "mlm_biased_untied": (MLM, lambda: transformers.ModernBertForMaskedLM(_config(**BIASED))),
  "classifier": (
    CLASSIFIER,
    lambda: transformers.ModernBertForSequenceClassification(_config(num_labels=3)),
  ),
  "classifier_mean_biased": (
    CLASSIFIER,
    lambda: transformers.ModernBertForSequenceClassification(
      _config(num_labels=2, classifier_pooling="mean", classifier_bias=True, norm_bias=True)
    ),
  ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (the HF model in eval mode, perturbed, and its save_pretrained directory)."""
  return {
    name: parity.saved(build, 60 + i, tmp_path_factory.mktemp(name))
    for i, (name, (_, build)) in enumerate(BUILDERS.items())
  }


def _inputs() -> dict[str, np.ndarray]:
  """Tokens 1..99 and the attention mask: row 1 right-padded, row 2 left and right."""
  rng = np.random.default_rng(0)
  mask = np.ones((B, T), np.int32)
  mask[1, 8:] = 0
  mask[2, :2] = 0
  mask[2, 10:] = 0
  tokens = np.where(mask > 0, rng.integers(1, V, (B, T)), 0).astype(np.int32)
  return {"tokens": tokens, "mask": mask}


def _hf_logits(model, x) -> np.ndarray:
  ids, mask = (torch.from_numpy(x[k].astype(np.int64)) for k in ("tokens", "mask"))
  with torch.no_grad():
    return model(input_ids=ids, attention_mask=mask).logits.float().numpy()


def _our_logits(config, params, x) -> np.ndarray:
  apply = jax.jit(build_model(config).apply)  # one compiled forward, not op by op
  return np.asarray(apply(params, x["tokens"], x["mask"]))


def _real(logits: np.ndarray, x) -> np.ndarray:
  """MLM logits at real tokens; classifier logits of the rows whose first token is real
  (a left-padded row's [CLS] slot is padding, which HF's attention lets see the real
  tokens and ours keeps to the padding: no [CLS] to compare)."""
  return logits[x["mask"] > 0] if logits.ndim == 3 else logits[x["mask"][:, 0] > 0]


def _check(arch: str, model, path, out) -> None:
  """tests/test_convert_hf.py's `check_parity_and_round_trip` on these inputs."""
  x = _inputs()
  want = _real(_hf_logits(model, x), x)
  config, params = convert.load(path)
  ours = _real(_our_logits(config, params, x), x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  bf16_config, bf16_params = convert.load(path, dtype="bfloat16")
  bf16 = _real(_our_logits(bf16_config, bf16_params, x), x)
  atol = 2e-2 * max(1.0, np.abs(want).max())  # bf16 keeps 8 significant bits
  if np.abs(bf16 - want).max() > atol:  # where HF's own bf16 model is further off
    theirs = _real(_hf_logits(copy.deepcopy(model).to(torch.bfloat16), x), x)
    atol = max(atol, 1.25 * np.abs(theirs - want).max())
  np.testing.assert_allclose(bf16, want, atol=atol, rtol=0)

  convert.save(out, config, params, arch)
  reloaded = getattr(transformers, arch).from_pretrained(out).eval()
  np.testing.assert_allclose(_real(_hf_logits(reloaded, x), x), ours, atol=1e-4, rtol=0)
  config2, params2 = convert.load(out)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)  # bit-identical
  assert jax.tree.structure(params2) == jax.tree.structure(params)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  _check(BUILDERS[name][0], *checkpoints[name], tmp_path / "export")


def test_config_fields_and_the_exported_config(checkpoints, tmp_path):
  config, params = convert.load(checkpoints["mlm"][1])
  assert (config.local_global_pattern, config.sliding_window) == ("GLL", 3)
  assert (config.rope_theta, config.rope_local_theta) == (160_000.0, 10_000.0)
  assert (config.activation, config.use_bias, config.norm_bias) == ("geglu", False, False)
  assert config.embed_norm and not config.first_layer_attention_norm
  assert (config.head_bias, config.mlm_output_bias, config.tie_embeddings) == (False, True, True)
  assert "self_attention_norm" not in params["params"]["encoder"]["layers"]["layer_0"]
  biased = convert.load(checkpoints["mlm_biased_untied"][1])[0]
  assert (biased.local_global_pattern, biased.sliding_window) == ("GL", 4)
  assert (biased.rope_theta, biased.rope_local_theta) == (500.0, 5.0)
  assert (biased.activation, biased.use_bias, biased.norm_bias) == ("geglu_tanh", True, True)
  assert (biased.head_bias, biased.mlm_output_bias, biased.tie_embeddings) == (True, False, False)
  mean = convert.load(checkpoints["classifier_mean_biased"][1])[0]
  assert (mean.num_classes, mean.pooling, mean.pooler_activation) == (2, "mean", "gelu_norm")

  convert.save(tmp_path / "out", config, params, MLM)
  written = json.loads((tmp_path / "out" / hf.CONFIG).read_text())
  theirs = checkpoints["mlm"][0].config
  assert written["model_type"] == "modernbert" and written["local_attention"] == 4
  assert (
    written["layer_types"] == theirs.layer_types == ["full_attention", *["sliding_attention"] * 2]
  )
  assert written["rope_parameters"] == theirs.rope_parameters
  assert written["pad_token_id"] == 0 and written["bos_token_id"] is None


def _our_real(config, params) -> np.ndarray:
  x = _inputs()
  return _real(_our_logits(config, params, x), x)


@pytest.mark.parametrize(
  "name, changes, moved",
  [
    ("mlm", {"sliding_window": 2}, 1e-2),  # about 0.11
    ("mlm", {"sliding_window": 4}, 1e-2),  # about 0.09
    ("mlm_biased_untied", {"rope_local_theta": 500.0}, 2e-3),  # about 0.008
  ],
)
def test_the_window_and_the_local_rope_base_matter(name, changes, moved, checkpoints):
  """A window one narrower or wider, or the global base on the local layers, moves the
  logits well past the 1e-4 tolerance: the parity above pins |t - s| <= local_attention //
  2 and the two bases (the local layers see distances up to 3 only, so the bases' effect
  is the smaller)."""
  model, path = checkpoints[name]
  config, params = convert.load(path)
  want = _real(_hf_logits(model, _inputs()), _inputs())
  np.testing.assert_allclose(_our_real(config, params), want, atol=1e-4, rtol=0)
  assert np.abs(_our_real(config.replace(**changes), params) - want).max() > moved


def _edited(src, dst, drop=(), **changes):
  dst.mkdir()
  for f in src.iterdir():
    (dst / f.name).write_bytes(f.read_bytes())
  config = json.loads((dst / hf.CONFIG).read_text())
  config = {k: v for k, v in config.items() if k not in drop}
  (dst / hf.CONFIG).write_text(json.dumps(config | changes))
  return dst


def test_a_4x_config_reads_as_transformers_5_reads_it(checkpoints, tmp_path):
  """`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta` instead of
  `layer_types` and `rope_parameters`: the same config, and HF's logits unchanged."""
  model, path = checkpoints["mlm_biased_untied"]
  old = _edited(
    path, tmp_path / "old", drop=("layer_types", "rope_parameters"),
    global_attn_every_n_layers=2, global_rope_theta=500.0, local_rope_theta=5.0,
  )  # fmt: skip
  assert convert.load(old)[0] == convert.load(path)[0]
  x = _inputs()
  reloaded = transformers.ModernBertForMaskedLM.from_pretrained(old).eval()
  np.testing.assert_array_equal(_hf_logits(reloaded, x), _hf_logits(model, x))


RULE = {"rope_type": "linear", "factor": 2.0, "rope_theta": 160_000.0}


@pytest.mark.parametrize(
  "name, changes, message",
  [
    ("mlm", {"hidden_activation": "relu"}, "hidden_activation='relu'"),
    ("mlm", {"mlp_bias": True}, "mlp_bias=True"),
    ("mlm", {"classifier_activation": "silu"}, "classifier_activation='silu'"),
    (
      "mlm",
      {"rope_parameters": {"full_attention": RULE}},
      "rope_parameters['full_attention'].rope_type='linear'",
    ),
    ("mlm", {"layer_types": ["full_attention", "chunked_attention"] * 2}, "layer_types=["),
    ("classifier", {"classifier_pooling": "max"}, "classifier_pooling='max'"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(name, changes, message, checkpoints, tmp_path):
  arch = BUILDERS[name][0]
  bad = _edited(checkpoints[name][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{arch}: {message}")) as e:
    convert.load(bad)
  assert "is not supported (supported: " in str(e.value) and "\n" not in str(e.value)


def test_a_config_modernbert_cannot_express_is_refused_in_one_line(checkpoints, tmp_path):
  config, params = convert.load(checkpoints["mlm"][1])
  with pytest.raises(ValueError, match=re.escape(f"{MLM}: ModelConfig.activation='gelu'")) as e:
    convert.save(tmp_path / "a", config.replace(activation="gelu"), params, MLM)
  assert "(supported: 'geglu', 'geglu_tanh', 'swiglu')" in str(e.value)
  local_base = re.escape("cannot express ModelConfig.rope_local_theta=None")
  with pytest.raises(ValueError, match=local_base) as e:
    convert.save(tmp_path / "b", config.replace(rope_local_theta=None), params, MLM)
  assert "\n" not in str(e.value)
