"""Hugging Face import / export (`transformer.convert`) against `transformers` itself.

Tiny random models (2 layers, width 32, vocabulary 100) are built with transformers'
config classes and `save_pretrained` into temporary directories; nothing is downloaded.
Imported models must give HF's logits (fp32 to 1e-4, bf16 to 2e-2) on padded, masked
inputs, the same greedy continuations, and export back to directories that
`from_pretrained` loads to the same logits and that re-import bit for bit.
"""

from __future__ import annotations

import copy
import json

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from transformer import convert
from transformer.convert import hf
from transformer.decode import generate
from transformer.nn import tree
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model

VOCAB, WIDTH, LAYERS, HEADS, FFN, MAX_LEN = 100, 32, 2, 4, 64, 64
COMMON = {"num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "hidden_size": WIDTH}
INIT = {"initializer_range": 0.1}  # logits of order 1, so the tolerances mean something
B, T = 3, 10  # batch, length of the logits inputs
CAUSAL = ("GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ENCODERS = ("Bert", "Roberta")  # name prefixes of the token-type encoders
VISION = ("ViT", "DeiT", "Dinov2")  # name prefixes of the image classifiers


def _gpt2():
  return transformers.GPT2LMHeadModel(
    transformers.GPT2Config(
      vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=MAX_LEN,
      bos_token_id=None, eos_token_id=None, **INIT,
    )
  )  # fmt: skip


def _llama():
  return transformers.LlamaForCausalLM(
    transformers.LlamaConfig(
      vocab_size=VOCAB, intermediate_size=FFN, num_key_value_heads=2,
      max_position_embeddings=MAX_LEN, rope_theta=500.0, bos_token_id=None,
      eos_token_id=None, pad_token_id=0, **COMMON, **INIT,
    )
  )  # fmt: skip


def _mistral():
  """A window of 4 keys, shorter than the inputs, so the band shows in the logits."""
  return transformers.MistralForCausalLM(
    transformers.MistralConfig(
      vocab_size=VOCAB, intermediate_size=FFN, num_key_value_heads=2, sliding_window=4,
      max_position_embeddings=MAX_LEN, bos_token_id=None, eos_token_id=None, pad_token_id=0,
      **COMMON, **INIT,
    )
  )  # fmt: skip


def _qwen2():
  """Biases on q/k/v only (perturbed by the fixture, so a dropped bias shows)."""
  return transformers.Qwen2ForCausalLM(
    transformers.Qwen2Config(
      vocab_size=VOCAB, intermediate_size=FFN, num_key_value_heads=2, tie_word_embeddings=True,
      max_position_embeddings=MAX_LEN, bos_token_id=None, eos_token_id=None, pad_token_id=0,
      **COMMON, **INIT,
    )
  )  # fmt: skip


def _bert_config(**extra):
  return transformers.BertConfig(
    vocab_size=VOCAB, intermediate_size=FFN, max_position_embeddings=MAX_LEN, type_vocab_size=2,
    **COMMON, **INIT, **extra,
  )  # fmt: skip


def _vit():
  return transformers.ViTForImageClassification(
    transformers.ViTConfig(
      intermediate_size=FFN, image_size=16, patch_size=4, num_labels=3, **COMMON, **INIT
    )
  )


BUILDERS = {
  "GPT2LMHeadModel": _gpt2,
  "LlamaForCausalLM": _llama,
  "MistralForCausalLM": _mistral,
  "Qwen2ForCausalLM": _qwen2,
  "BertForMaskedLM": lambda: transformers.BertForMaskedLM(_bert_config()),
  "BertForSequenceClassification": lambda: transformers.BertForSequenceClassification(
    _bert_config(num_labels=3)
  ),
  "ViTForImageClassification": _vit,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return saved_all(BUILDERS, 0, tmp_path_factory)


def saved_all(builders: dict, first_seed: int, tmp_path_factory) -> dict:
  """Architecture -> (the HF model in eval mode, its save_pretrained directory), for
  `builders` (architecture -> build()), seeded first_seed, first_seed + 1, ..."""
  return {
    name: saved(build, first_seed + i, tmp_path_factory.mktemp(name))
    for i, (name, build) in enumerate(builders.items())
  }


def saved(build, seed: int, path):
  """(HF model `build()` in eval mode, perturbed, and `path` where it is saved)."""
  torch.manual_seed(seed)
  model = build().eval()
  with torch.no_grad():  # non-trivial norms and biases, so a swapped tensor shows
    for pname, p in model.named_parameters():
      if pname.endswith("bias") or "norm" in pname.lower():
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model, path


def _inputs(arch: str) -> dict[str, np.ndarray]:
  """Padded inputs: tokens (PAD = 0; RoBERTa's 1), mask, positions, token types; or images."""
  rng = np.random.default_rng(0)
  if arch.startswith(VISION):
    return {"images": rng.normal(size=(B, 16, 16, 3)).astype(np.float32)}
  mask = np.ones((B, T), np.int32)
  mask[1, :3] = 0 if arch in CAUSAL else 1  # left padding
  mask[2, 6:] = 0  # right padding
  roberta = arch.startswith("Roberta")  # HF numbers positions from PAD 1; one token type
  pad = 1 if roberta else 0
  tokens = np.where(mask > 0, rng.integers(pad + 1, VOCAB, (B, T)), pad).astype(np.int32)
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  types = (np.arange(T) >= 4).astype(np.int32)[None].repeat(B, 0) * mask * (not roberta)
  return {"tokens": tokens, "mask": mask, "positions": positions, "types": types}


def _hf_logits(arch: str, model, x: dict[str, np.ndarray]) -> np.ndarray:
  t = {
    k: torch.from_numpy(np.asarray(v, np.int64 if k != "images" else np.float32))
    for k, v in x.items()
  }
  with torch.no_grad():
    if arch.startswith(VISION):
      return model(pixel_values=t["images"].permute(0, 3, 1, 2)).logits.numpy()
    kwargs = {"input_ids": t["tokens"], "attention_mask": t["mask"]}
    if arch.startswith(ENCODERS):  # RoBERTa's positions: HF's own, from the PAD tokens
      kwargs["token_type_ids"] = t["types"]
    else:
      kwargs["position_ids"] = t["positions"]
    return model(**kwargs).logits.float().numpy()


def _hf_bf16_logits(arch: str, model, x: dict[str, np.ndarray]) -> np.ndarray:
  """The logits of a bfloat16 copy of HF's `model` (token inputs), as float32."""
  bf16 = copy.deepcopy(model).to(torch.bfloat16)
  return _hf_logits(arch, bf16, x).astype(np.float32)


def _our_logits(arch: str, config: ModelConfig, params, x: dict[str, np.ndarray]) -> np.ndarray:
  # One compiled forward: op by op, each of the model's ~120 primitives would compile alone.
  apply = jax.jit(build_model(config).apply)
  if arch.startswith(VISION):
    return np.asarray(apply(params, x["images"]))
  if arch.startswith(ENCODERS):  # RoBERTa numbers the real tokens, BERT every slot
    positions = x["positions"] if arch.startswith("Roberta") else None
    return np.asarray(apply(params, x["tokens"], x["mask"], positions, token_type_ids=x["types"]))
  return np.asarray(apply(params, x["tokens"], x["positions"], x["mask"]))


def _real(arch: str, logits: np.ndarray, x: dict[str, np.ndarray]) -> np.ndarray:
  """Logits at real (unpadded) tokens; classifiers' [B, C] as they are."""
  return logits if logits.ndim == 2 else logits[x["mask"] > 0]


def check_parity_and_round_trip(arch: str, model, path, out) -> None:
  """The checkpoint at `path` (saved from HF's `model`) imports to HF's logits in fp32 and
  bf16, exports to `out`, which HF loads to the same logits, and re-imports bit for bit."""
  x = _inputs(arch)
  want = _real(arch, _hf_logits(arch, model, x), x)

  config, params = convert.load(path)
  ours = _real(arch, _our_logits(arch, config, params, x), x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  bf16_config, bf16_params = convert.load(path, dtype="bfloat16")
  assert bf16_config.dtype == "bfloat16"
  # bf16 keeps 8 significant bits: on these logits (largest about 2) Hugging Face's own bf16
  # model is 0.018-0.026 off its fp32 logits, so 2e-2 is relative to the largest logit.
  # Where HF's own bf16 model is further off (OLMo 2's norms after the sublayers: 0.053),
  # ours may be as far as 1.25 times that.
  bf16 = _real(arch, _our_logits(arch, bf16_config, bf16_params, x), x)
  atol = 2e-2 * max(1.0, np.abs(want).max())
  if np.abs(bf16 - want).max() > atol:
    atol = max(atol, 1.25 * np.abs(_real(arch, _hf_bf16_logits(arch, model, x), x) - want).max())
  np.testing.assert_allclose(bf16, want, atol=atol, rtol=0)

  convert.save(out, config, params, arch)
  reloaded = getattr(transformers, arch).from_pretrained(out).eval()
  np.testing.assert_allclose(_real(arch, _hf_logits(arch, reloaded, x), x), ours, atol=1e-4, rtol=0)
  config2, params2 = convert.load(out)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)  # bit-identical
  assert jax.tree.structure(params2) == jax.tree.structure(params)


def edited(src, dst, **changes):
  """A copy of the checkpoint directory `src` at `dst` with `changes` in its config.json."""
  dst.mkdir()
  for f in src.iterdir():
    (dst / f.name).write_bytes(f.read_bytes())
  config = json.loads((dst / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps(config | changes))
  return dst


def check_greedy(model, path) -> None:
  """Greedy continuations of ragged (left-padded) prompts equal HF `generate`'s."""
  config, params = convert.load(path)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(1, VOCAB, n).tolist() for n in (5, 8, 3)]  # ragged: left-padded
  ours = generate(build_model(config), params, prompts, max_new_tokens=32, eos_id=None)
  for prompt, row in zip(prompts, np.asarray(ours.tokens), strict=True):
    with torch.no_grad():
      theirs = model.generate(
        torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0
      )[0, len(prompt) :].numpy()
    np.testing.assert_array_equal(row, theirs)


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(arch, checkpoints, tmp_path):
  model, path = checkpoints[arch]
  check_parity_and_round_trip(arch, model, path, tmp_path / "export")


def test_untied_bert_masked_lm_takes_the_decoders_bias(tmp_path):
  """Untied, HF's logits add `cls.predictions.decoder.bias`, not `cls.predictions.bias`."""
  build = lambda: transformers.BertForMaskedLM(_bert_config(tie_word_embeddings=False))
  model, path = saved(build, 9, tmp_path / "hf")
  with torch.no_grad():  # the two biases differ, so taking the wrong one shows
    model.cls.predictions.decoder.bias.add_(0.5 * torch.randn_like(model.cls.predictions.bias))
  model.save_pretrained(path)
  check_parity_and_round_trip("BertForMaskedLM", model, path, tmp_path / "export")


def test_llama_head_dim_mqa_tied_and_biased(tmp_path):
  """head_dim != D / N (ModelConfig.attention_head_dim), one kv head, tied head, biases."""
  torch.manual_seed(7)
  config = transformers.LlamaConfig(
    vocab_size=VOCAB, intermediate_size=FFN, num_key_value_heads=1, head_dim=16,
    max_position_embeddings=MAX_LEN, tie_word_embeddings=True, attention_bias=True,
    mlp_bias=True, **COMMON, **INIT,
  )  # fmt: skip
  model = transformers.LlamaForCausalLM(config).eval()
  model.save_pretrained(tmp_path / "hf")
  ours_config, params = convert.load(tmp_path / "hf")
  assert (ours_config.head_dim, ours_config.kv_heads) == (16, 1)
  assert ours_config.tie_embeddings and ours_config.use_bias
  arch, x = "LlamaForCausalLM", _inputs("LlamaForCausalLM")
  ours = _real(arch, _our_logits(arch, ours_config, params, x), x)
  np.testing.assert_allclose(ours, _real(arch, _hf_logits(arch, model, x), x), atol=1e-4, rtol=0)
  convert.save(tmp_path / "out", ours_config, params, arch)
  reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
  np.testing.assert_allclose(_real(arch, _hf_logits(arch, reloaded, x), x), ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", CAUSAL)
def test_greedy_generation_matches_hf(arch, checkpoints):
  check_greedy(*checkpoints[arch])


def test_sharded_checkpoints_load_and_save(checkpoints, tmp_path):
  model, path = checkpoints["GPT2LMHeadModel"]
  model.save_pretrained(tmp_path / "hf_sharded", max_shard_size="20KB")
  index = json.loads((tmp_path / "hf_sharded" / hf.INDEX).read_text())
  assert len(set(index["weight_map"].values())) > 1
  config, params = convert.load(tmp_path / "hf_sharded")
  _, single = convert.load(path)
  jax.tree.map(np.testing.assert_array_equal, params, single)

  convert.save(tmp_path / "ours", config, params, "GPT2LMHeadModel", max_shard_bytes=20_000)
  files = sorted(p.name for p in (tmp_path / "ours").glob("model-*.safetensors"))
  assert len(files) > 1 and not (tmp_path / "ours" / hf.WEIGHTS).exists()
  reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
  x = _inputs("GPT2LMHeadModel")
  np.testing.assert_allclose(
    _hf_logits("GPT2LMHeadModel", reloaded, x), _hf_logits("GPT2LMHeadModel", model, x), atol=0
  )


def test_a_truncated_or_missing_shard_is_named(checkpoints, tmp_path):
  model, _ = checkpoints["GPT2LMHeadModel"]
  root = tmp_path / "sharded"
  model.save_pretrained(root, max_shard_size="20KB")
  shards = sorted(set(json.loads((root / hf.INDEX).read_text())["weight_map"].values()))
  victim = root / shards[1]
  data = victim.read_bytes()
  victim.write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match=rf"{shards[1]}: cannot read .*truncated"):
    convert.load(root)
  victim.unlink()
  with pytest.raises(ValueError, match=rf"{shards[1]}: a shard named in .* is missing"):
    convert.load(root)


def _rewrite(src, dst, edit_tensors=None, edit_config=None):
  """A copy of checkpoint `src` with its tensors and/or config.json edited in place."""
  dst.mkdir()
  tensors = load_file(src / hf.WEIGHTS)
  config = json.loads((src / hf.CONFIG).read_text())
  if edit_tensors:
    edit_tensors(tensors)
  if edit_config:
    edit_config(config)
  save_file(tensors, dst / hf.WEIGHTS, metadata={"format": "pt"})
  (dst / hf.CONFIG).write_text(json.dumps(config))
  return dst


def test_a_shape_mismatch_names_the_parameter_and_both_shapes(checkpoints, tmp_path):
  _, path = checkpoints["LlamaForCausalLM"]

  def cut(t):
    t["model.layers.1.self_attn.k_proj.weight"] = t["model.layers.1.self_attn.k_proj.weight"][:8]

  bad = _rewrite(path, tmp_path / "bad", cut)
  with pytest.raises(ValueError) as e:
    convert.load(bad)
  message = str(e.value)
  assert "'model.layers.1.self_attn.k_proj.weight' has shape [8, 32]" in message
  assert "decoder/layer_1/self_attention/key/kernel [32, 2, 8]" in message
  assert "needs [16, 32]" in message and "\n" not in message


def test_a_bare_backbone_checkpoint_loads(checkpoints, tmp_path):
  """The original GPT-2 files name tensors 'h.0...' without the 'transformer.' prefix."""
  _, path = checkpoints["GPT2LMHeadModel"]

  def strip(t):
    for name in list(t):
      t[name.removeprefix("transformer.")] = t.pop(name)

  bare = _rewrite(path, tmp_path / "bare", strip)
  _, params = convert.load(bare)
  _, want = convert.load(path)
  jax.tree.map(np.testing.assert_array_equal, params, want)


def test_unsupported_architectures_and_options_are_one_line(checkpoints, tmp_path):
  _, gpt2 = checkpoints["GPT2LMHeadModel"]
  _, llama = checkpoints["LlamaForCausalLM"]

  def rename(c):
    c["architectures"] = ["GPT2ForTokenClassification"]

  def scaled(c):
    c["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}

  cases = [
    (_rewrite(gpt2, tmp_path / "a", edit_config=rename), "GPT2ForTokenClassification"),
    (_rewrite(llama, tmp_path / "b", edit_config=scaled), "rope_type='dynamic'"),
  ]
  for bad, what in cases:
    with pytest.raises(ValueError) as e:
      convert.load(bad)
    assert what in str(e.value) and "supported" in str(e.value) and "\n" not in str(e.value)
  assert "GPT2LMHeadModel, BertForMaskedLM" in str(_error(convert.load, cases[0][0]))
  assert "'default'" in str(_error(convert.load, cases[1][0]))

  config, params = convert.load(llama)
  with pytest.raises(ValueError, match=r"GPT2LMHeadModel: ModelConfig.activation='swiglu' is not"):
    convert.save(tmp_path / "c", config, params, "GPT2LMHeadModel")
  config, params = convert.load(gpt2)
  rope = r"GPT2LMHeadModel cannot express ModelConfig.position='rope' \(it has position='learned'\)"
  with pytest.raises(ValueError, match=rope):
    convert.save(tmp_path / "c", config.replace(position="rope"), params, "GPT2LMHeadModel")
  with pytest.raises(ValueError, match=r"parameter decoder/final_norm/scale has shape \[31\]"):
    bad = jax.tree_util.tree_map_with_path(
      lambda k, v: v[:31] if tree.path_str(k).endswith("final_norm/scale") else v, params
    )
    convert.save(tmp_path / "c", config, bad, "GPT2LMHeadModel")
  with pytest.raises(ValueError, match=r"architecture='T9' is not supported \(supported: GPT2"):
    convert.save(tmp_path / "d", config, params, "T9")


def test_qwen2_windows_and_llama_family_refusals(checkpoints, tmp_path):
  """Qwen2 with a window on every layer imports (and matches HF); a mix is one line."""
  torch.manual_seed(3)
  config = transformers.Qwen2Config(
    vocab_size=VOCAB, intermediate_size=FFN, num_key_value_heads=1, use_sliding_window=True,
    sliding_window=3, max_window_layers=0, max_position_embeddings=MAX_LEN, **COMMON, **INIT,
  )  # fmt: skip
  model = transformers.Qwen2ForCausalLM(config).eval()
  model.save_pretrained(tmp_path / "windowed")
  ours_config, params = convert.load(tmp_path / "windowed")
  assert (ours_config.sliding_window, ours_config.qkv_bias, ours_config.use_bias) == (
    3,
    True,
    False,
  )
  arch, x = "Qwen2ForCausalLM", _inputs("Qwen2ForCausalLM")
  ours = _real(arch, _our_logits(arch, ours_config, params, x), x)
  np.testing.assert_allclose(ours, _real(arch, _hf_logits(arch, model, x), x), atol=1e-4, rtol=0)
  convert.save(tmp_path / "out", ours_config, params, arch)
  assert convert.load(tmp_path / "out")[0] == ours_config

  def mixed(c):
    c["layer_types"] = ["full_attention", "sliding_attention"]

  message = str(_error(convert.load, _rewrite(tmp_path / "windowed", tmp_path / "m", None, mixed)))
  assert "Qwen2ForCausalLM" in message and "layer_types" in message and "\n" not in message
  _, params = convert.load(checkpoints["LlamaForCausalLM"][1])
  llama = convert.load(checkpoints["LlamaForCausalLM"][1])[0]
  with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express ModelConfig.sliding_w"):
    convert.save(tmp_path / "l", llama.replace(sliding_window=4), params, "LlamaForCausalLM")
  with pytest.raises(ValueError, match=r"Qwen2ForCausalLM cannot express ModelConfig.qkv_bias"):
    convert.save(tmp_path / "q", llama, params, "Qwen2ForCausalLM")


def _error(fn, *args) -> ValueError:
  with pytest.raises(ValueError) as e:
    fn(*args)
  return e.value


def test_converting_needs_no_torch_or_transformers():
  import subprocess
  import sys

  code = (
    "import sys, transformer.convert, transformer.nn.models; "
    "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
