"""T5 v1.0 and v1.1 from and to Hugging Face: logits, greedy decoding, export, round trip.

The references are tiny random `T5ForConditionalGeneration` models (torch, fp32) saved
to a temporary directory: v1.0 (ReLU, tied head, decoder output * D**-0.5) and v1.1
(gated tanh-GELU, its own head, H * N != D).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from transformer.convert import hf, registry  # noqa: E402
from transformer.convert.t5 import ARCHITECTURE, CONVERTERS  # noqa: E402
from transformer.decode import translate  # noqa: E402
from transformer.nn.models import build_model, param_count  # noqa: E402
from transformer.nn.positions.relative_t5 import t5_relative_bucket  # noqa: E402

VOCAB, D, LAYERS = 100, 32, 2
VARIANTS = {
  # feed_forward_proj, tied head, heads, head dim (d_kv)
  "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True, num_heads=4, d_kv=8),
  "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_heads=3, d_kv=16),
}
# Right-padded sources and targets of different lengths (0 = PAD); ids >= 2 (1 is EOS).
SOURCE_LENGTHS, TARGET_LENGTHS = (13, 7, 20), (9, 16, 4)


def _rows(lengths: tuple[int, ...], seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  out = np.zeros((len(lengths), max(lengths)), np.int64)  # [B, L]
  for i, n in enumerate(lengths):
    out[i, :n] = rng.integers(2, VOCAB, n)
  return out


def _hf_logits(model, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
  decoder_inputs = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # T5: start from PAD
  with torch.no_grad():
    out = model(
      input_ids=torch.from_numpy(inputs),
      attention_mask=torch.from_numpy((inputs != 0).astype(np.int64)),
      decoder_input_ids=torch.from_numpy(decoder_inputs),
    )
  return out.logits.numpy()  # [B, T, V]


def _ours_logits(config, params, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
  apply = jax.jit(build_model(config).apply)  # one compiled forward, not op by op
  logits = apply({"params": params}, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets))
  return np.asarray(logits)  # [B, T, V]


def test_t5_is_registered():
  assert registry.ARCHITECTURES[ARCHITECTURE] is CONVERTERS[ARCHITECTURE]


@pytest.fixture(scope="module", params=list(VARIANTS))
def t5(request, tmp_path_factory):
  """(variant, HF model, its saved directory, our config, our params)."""
  torch.manual_seed(0)
  hf_config = transformers.T5Config(
    vocab_size=VOCAB,
    d_model=D,
    d_ff=64,
    num_layers=LAYERS,
    dropout_rate=0.0,
    **VARIANTS[request.param],
  )
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  if not VARIANTS[request.param]["tie_word_embeddings"]:
    # v1.1 checkpoints carry their own head (HF >= 5 builds every T5 tied).
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, D))
    model.config.tie_word_embeddings = False
  directory = tmp_path_factory.mktemp(f"t5_{request.param}")
  model.save_pretrained(directory)
  config, params = hf.load(directory)
  return request.param, model, directory, config, params["params"]


def test_bucket_function_matches_hf():
  relative = np.arange(-300, 301)[None, :] - np.zeros((1, 1), np.int64)  # [1, 601]
  bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
  for bidirectional in (True, False):
    for buckets, distance in ((32, 128), (8, 20)):
      theirs = bucket(torch.from_numpy(relative), bidirectional, buckets, distance).numpy()
      ours = t5_relative_bucket(jnp.asarray(relative), bidirectional, buckets, distance)
      np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_config_and_param_count(t5):
  variant, model, _, config, params = t5
  assert config.tie_embeddings == (variant == "v1.0")
  assert config.scale_logits == (variant == "v1.0")
  assert config.activation == ("relu" if variant == "v1.0" else "geglu_tanh")
  assert config.head_dim == VARIANTS[variant]["d_kv"]
  # HF counts the shared table once and a tied head not at all, as we do.
  theirs = sum(p.numel() for p in model.parameters())
  assert param_count(config) == sum(x.size for x in jax.tree.leaves(params)) == theirs


def test_logits_match_hf_fp32_and_bf16(t5):
  _, model, _, config, params = t5
  inputs, targets = _rows(SOURCE_LENGTHS, 1), _rows(TARGET_LENGTHS, 2)
  theirs = _hf_logits(model, inputs, targets)
  valid = targets != 0  # [B, T]: positions past a target's end see different masks
  ours = _ours_logits(config, params, inputs, targets)
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4, rtol=0)
  for impl in ("jax", "chunked"):
    other = _ours_logits(
      config.replace(attention_impl=impl, attention_chunk_size=8), params, inputs, targets
    )
    np.testing.assert_allclose(other[valid], theirs[valid], atol=1e-4, rtol=0)
  half = _ours_logits(config.replace(dtype="bfloat16"), params, inputs, targets)
  scale = np.abs(theirs[valid]).max()
  assert np.abs(half[valid] - theirs[valid]).max() <= 2e-2 * scale


def test_greedy_translation_matches_hf_generate(t5):
  _, model, _, config, params = t5
  inputs = _rows(SOURCE_LENGTHS, 3)
  length = 32
  with torch.no_grad():
    hf = model.generate(
      input_ids=torch.from_numpy(inputs),
      attention_mask=torch.from_numpy((inputs != 0).astype(np.int64)),
      max_new_tokens=length,
      do_sample=False,
      num_beams=1,
      decoder_start_token_id=0,
      eos_token_id=1,
      pad_token_id=0,
    ).numpy()[:, 1:]  # drop the start token
  hf = np.pad(hf, ((0, 0), (0, length - hf.shape[1])))  # stopped rows end in PAD
  ours = translate(build_model(config), params, inputs, max_len=length, eos_id=1)
  np.testing.assert_array_equal(np.asarray(ours.tokens), hf)


def test_export_loads_in_hf_and_round_trips(t5, tmp_path):
  variant, _, _, config, params = t5
  hf.save(tmp_path, config, params, ARCHITECTURE)
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  assert reloaded.config.scale_decoder_outputs == (variant == "v1.0")
  inputs, targets = _rows(SOURCE_LENGTHS, 4), _rows(TARGET_LENGTHS, 5)
  valid = targets != 0
  theirs = _hf_logits(reloaded, inputs, targets)
  ours = _ours_logits(config, params, inputs, targets)
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4, rtol=0)
  config_back, params_back = hf.load(tmp_path)
  assert config_back == config
  jax.tree.map(np.testing.assert_array_equal, params_back["params"], params)


def test_refuses_what_does_not_fit(t5, tmp_path):
  _, _, directory, config, params = t5
  tensors = hf.read_tensors(directory)
  converter = CONVERTERS[ARCHITECTURE]
  missing = {k: v for k, v in tensors.items() if k != "decoder.final_layer_norm.weight"}
  with pytest.raises(ValueError, match="no tensor 'decoder.final_layer_norm.weight'"):
    hf.convert_from_hf(missing, config, converter)
  with pytest.raises(ValueError, match="has shape"):
    hf.convert_from_hf(tensors, config.replace(d_ff=48), converter)
  with pytest.raises(ValueError, match="cannot express"):
    hf.save(tmp_path, config.replace(attention_scale=None), params, ARCHITECTURE)
  with pytest.raises(ValueError, match="feed_forward_proj='gated-relu' is not supported"):
    converter.config_from_hf({**hf.read_config(directory), "feed_forward_proj": "gated-relu"})
