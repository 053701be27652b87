"""BART and Marian (Opus-MT) from and to Hugging Face: logits, greedy decoding, export, ids.

The references are tiny random `BartForConditionalGeneration` (GELU, learned positions,
embedding norms) and `MarianMTModel` (SiLU, scaled embeddings, sinusoids) models built
with transformers' own classes, norms and biases perturbed and `final_logits_bias` drawn
non-zero, saved to temporary directories. Inputs are HF ids with HF's PAD and attention
mask; our model takes the same ids with PAD and 0 swapped (`convert.bart`), and its
logits, columns swapped back, are compared with HF's at the real target positions.
"""

from __future__ import annotations

import copy
import json

import jax
import numpy as np
import pytest
import test_convert_hf as parity  # the HF-saving helper and the bf16 reference
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from transformer import convert
from transformer.convert import bart, marian, registry, tokenizers
from transformer.convert.bart import swap
from transformer.data.tokenizers import load_tokenizer
from transformer.decode import translate
from transformer.nn.models import build_model, param_count

VOCAB, D, LAYERS, HEADS, FFN, MAX_LEN = 100, 32, 2, 4, 64, 64
SIZES = dict(
  vocab_size=VOCAB, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS,
  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
  decoder_ffn_dim=FFN, max_position_embeddings=MAX_LEN, dropout=0.0,
)  # fmt: skip
# Weight scales: 0.1 gives logits of order 1 (the tolerances of `parity`); greedy decoding
# uses 0.6, whose outputs differ by source and step (at 0.1 each row repeats one token).
PARITY_STD, GREEDY_STD = 0.1, 0.6
BART, MARIAN = bart.ARCHITECTURE, marian.ARCHITECTURE
# HF's ids per family: PAD, EOS, decoder start.
IDS = {BART: (1, 2, 2), MARIAN: (VOCAB - 1, 0, VOCAB - 1)}
SOURCE_MASK = ((1,) * 12, (1,) * 7 + (0,) * 5, (0,) * 3 + (1,) * 9)  # right and left padding
TARGET_LENGTHS = (10, 6, 3)


def _with_bias(model):
  with torch.no_grad():  # a buffer, which `parity.saved` leaves at zeros
    model.final_logits_bias.normal_(0.0, 0.5)
  return model


BUILDERS = {  # init_std -> HF model
  BART: lambda std: _with_bias(
    transformers.BartForConditionalGeneration(transformers.BartConfig(**SIZES, init_std=std))
  ),
  MARIAN: lambda std: _with_bias(
    transformers.MarianMTModel(
      transformers.MarianConfig(
        **SIZES,
        init_std=std,
        pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1,
        activation_function="swish",
        scale_embedding=True,
      )
    )
  ),  # fmt: skip
}


def _saved(arch: str, std: float, tmp_path_factory):
  """(architecture, HF model, its directory, our config, our params)."""
  build = lambda: BUILDERS[arch](std)
  model, path = parity.saved(build, 11, tmp_path_factory.mktemp(arch))
  config, params = convert.load(path)
  return arch, model, path, config, params


@pytest.fixture(scope="module", params=list(BUILDERS))
def checkpoint(request, tmp_path_factory):
  return _saved(request.param, PARITY_STD, tmp_path_factory)


@pytest.fixture(scope="module", params=list(BUILDERS))
def greedy_checkpoint(request, tmp_path_factory):
  return _saved(request.param, GREEDY_STD, tmp_path_factory)


def _hf_ids(mask: np.ndarray, pad: int, seed: int) -> np.ndarray:
  """HF token ids [B, L] (id 0 included) with PAD where `mask` is 0."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB - 1, mask.shape)
  ids[ids == pad] = 0
  ids[:, 0] = 0  # BART's BOS, Marian's EOS: the swapped id shows up in every row
  return np.where(mask > 0, ids, pad).astype(np.int64)


def _inputs(arch: str) -> tuple[np.ndarray, np.ndarray]:
  """HF sources [B, S] and targets [B, T] (right-padded), padded with HF's PAD."""
  pad = IDS[arch][0]
  targets = np.arange(max(TARGET_LENGTHS))[None] < np.array(TARGET_LENGTHS)[:, None]
  return _hf_ids(np.array(SOURCE_MASK), pad, 1), _hf_ids(targets.astype(int), pad, 2)


def _hf_logits(arch: str, model, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
  pad, _, start = IDS[arch]
  decoder_inputs = np.concatenate([np.full_like(targets[:, :1], start), targets[:, :-1]], 1)
  with torch.no_grad():
    out = model(
      input_ids=torch.from_numpy(sources),
      attention_mask=torch.from_numpy((sources != pad).astype(np.int64)),
      decoder_input_ids=torch.from_numpy(decoder_inputs),
    )
  return out.logits.float().numpy()  # [B, T, V]


def _our_logits(arch: str, config, params, sources: np.ndarray, targets: np.ndarray):
  """Our logits [B, T, V] on the swapped ids, columns back in HF's id order."""
  pad = IDS[arch][0]
  ours = build_model(config).apply(params, swap(sources, pad), swap(targets, pad))
  return np.asarray(ours)[..., swap(np.arange(VOCAB), pad)]


def test_both_are_registered():
  assert registry.ARCHITECTURES[BART] is bart.CONVERTERS[BART]
  assert registry.ARCHITECTURES[MARIAN] is marian.CONVERTERS[MARIAN]


def test_config_and_param_count(checkpoint):
  arch, model, _, config, params = checkpoint
  if arch == BART:
    assert (config.position, config.embed_norm, config.decoder_start_id) == ("learned", True, 2)
    assert not config.scale_embeddings and config.activation == "gelu"
  else:
    assert (config.position, config.sinusoidal_layout, config.decoder_start_id) == (
      "sinusoidal",
      "split",
      0,
    )
    assert config.scale_embeddings and config.activation == "silu"
  assert config.norm_position == "post" and config.final_logits_bias and config.tie_embeddings
  # HF counts its position tables (BART: 2 unused rows each; Marian: the fixed sinusoids)
  # and not the `final_logits_bias` buffer.
  theirs = sum(p.numel() for p in model.parameters())
  tables = 2 * bart.OFFSET * D if arch == BART else 2 * MAX_LEN * D
  assert param_count(config) == sum(x.size for x in jax.tree.leaves(params))
  assert param_count(config) == theirs - tables + VOCAB


def test_logits_match_hf_fp32_and_bf16_and_export_round_trips(checkpoint, tmp_path):
  arch, model, path, config, params = checkpoint
  sources, targets = _inputs(arch)
  valid = targets != IDS[arch][0]  # [B, T]: the real target positions
  want = _hf_logits(arch, model, sources, targets)[valid]
  ours = _our_logits(arch, config, params, sources, targets)[valid]
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)

  half_config, half_params = convert.load(path, dtype="bfloat16")
  half = _our_logits(arch, half_config, half_params, sources, targets)[valid]
  atol = 2e-2 * max(1.0, np.abs(want).max())  # the rule of `parity.check_parity_and_round_trip`
  if np.abs(half - want).max() > atol:
    hf_half = _hf_logits(arch, copy.deepcopy(model).to(torch.bfloat16), sources, targets)[valid]
    atol = max(atol, 1.25 * np.abs(hf_half - want).max())
  np.testing.assert_allclose(half, want, atol=atol, rtol=0)

  convert.save(tmp_path, config, params, arch)
  reloaded = getattr(transformers, arch).from_pretrained(tmp_path).eval()
  back = _hf_logits(arch, reloaded, sources, targets)[valid]
  np.testing.assert_allclose(back, ours, atol=1e-4, rtol=0)
  assert reloaded.config.pad_token_id == IDS[arch][0]
  assert reloaded.config.decoder_start_token_id == IDS[arch][2]
  config_back, params_back = convert.load(tmp_path)
  assert config_back == config
  jax.tree.map(np.testing.assert_array_equal, params_back, params)  # bit-identical
  assert jax.tree.structure(params_back) == jax.tree.structure(params)


def _hf_greedy(arch: str, model, sources: np.ndarray, eos: int, length: int) -> np.ndarray:
  """HF `generate`'s greedy tokens [B, length] after the start token, PAD after EOS."""
  pad, _, start = IDS[arch]
  with torch.no_grad():
    out = model.generate(
      input_ids=torch.from_numpy(sources),
      attention_mask=torch.from_numpy((sources != pad).astype(np.int64)),
      max_new_tokens=length,
      do_sample=False,
      num_beams=1,
      decoder_start_token_id=start,
      eos_token_id=eos,
      pad_token_id=pad,
      forced_eos_token_id=None,  # no EOS forced at the length limit (ours stops there)
    ).numpy()[:, 1:]  # without the start token
  return np.pad(out, ((0, 0), (0, length - out.shape[1])), constant_values=pad)


def test_greedy_translation_matches_hf_generate(greedy_checkpoint):
  """With the family's EOS, then with a token the model does emit as EOS, so that rows
  stop at different steps (these random models seldom emit their EOS)."""
  arch, model, _, config, params = greedy_checkpoint
  pad, eos, _ = IDS[arch]
  sources, _ = _inputs(arch)
  length = 24
  theirs = _hf_greedy(arch, model, sources, eos, length)
  stop = int(theirs[-1, -1])
  stopped = _hf_greedy(arch, model, sources, stop, length)
  assert (stopped == pad).any() and len(set(theirs.ravel().tolist())) > 2  # not degenerate
  for eos_id, want in ((eos, theirs), (stop, stopped)):
    out = translate(
      build_model(config), params, swap(sources, pad), max_len=length, eos_id=swap(eos_id, pad)
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), swap(want, pad))


def _write_word_tokenizer(root, vocab: list[str], specials: dict[str, str]) -> None:
  """A word-level tokenizer.json over `vocab` and its tokenizer_config.json."""
  tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(list(specials.values()))
  tok.save(str(root / "tokenizer.json"))
  (root / "tokenizer_config.json").write_text(json.dumps(specials))


def test_the_directory_tokenizer_swaps_the_same_ids(checkpoint, tmp_path):
  arch, _, path, config, _ = checkpoint
  pad, eos, _ = IDS[arch]
  words = [f"w{i}" for i in range(VOCAB)]
  if arch == BART:  # BOS 0, PAD 1, EOS 2, UNK 3
    words[:4] = ["<s>", "<pad>", "</s>", "<unk>"]
    specials = dict(bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
  else:  # EOS 0, UNK 1, PAD last
    words[0], words[1], words[-1] = "</s>", "<unk>", "<pad>"
    specials = dict(pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
  (tmp_path / "dir").mkdir()
  root = tmp_path / "dir"
  (root / "config.json").write_text((path / "config.json").read_text())
  _write_word_tokenizer(root, words, specials)
  tok = tokenizers.from_pretrained_dir(root)
  assert (
    tok.pad_id == 0
    and tok.eos_id == swap(eos, pad)
    and tok.unk_id == swap(3 if arch == BART else 1, pad)
  )
  text = f"{words[0]} w10 {words[pad]} w42"
  assert tok.encode(text) == [swap(0, pad), 10, 0, 42]
  assert tok.id_to_piece(0) == words[pad] and tok.id_to_piece(10) == "w10"
  assert tok.decode([10, swap(eos, pad), 42]) == "w10 w42"  # specials dropped
  saved = load_tokenizer(str(tokenizers.save_to_workdir(tok, tmp_path / "work")))
  assert saved.encode(text) == tok.encode(text) and saved.eos_id == tok.eos_id
  # The translation pipeline's rows end in the model's EOS and pad with 0, which it predicts.
  assert tok.encode(words[eos]) == [swap(eos, pad)] and config.decoder_start_id == swap(
    IDS[arch][2], pad
  )


def test_unsupported_options_are_one_line(checkpoint, tmp_path):
  arch, _, path, config, params = checkpoint
  hf_config = json.loads((path / "config.json").read_text())
  converter = registry.get(arch)
  cases = [
    ({"pad_token_id": 5}, "pad_token_id=5 is not supported"),
    ({"activation_function": "gelu_fast"}, "activation_function='gelu_fast' is not supported"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings=False is not supported"),
    ({"decoder_ffn_dim": 48}, "decoder_ffn_dim=48 is not supported (supported: 64, the encoder's)"),
  ]
  if arch == BART:
    cases.append(({"normalize_before": True}, "normalize_before=True is not supported"))
    cases.append(({"add_final_layer_norm": True}, "add_final_layer_norm=True"))
  else:
    cases.append(({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"))
    cases.append(({"decoder_vocab_size": 64}, "decoder_vocab_size=64 is not supported"))
    cases.append(({"normalize_embedding": True}, "normalize_embedding=True is not supported"))
  for change, message in cases:
    with pytest.raises(ValueError) as e:
      converter.config_from_hf({**hf_config, **change})
    assert message in str(e.value) and arch in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(ValueError, match=f"{arch} cannot express ModelConfig.norm_position='pre'"):
    convert.save(tmp_path, config.replace(norm_position="pre"), params, arch)
