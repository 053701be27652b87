"""DeiT (distillation token) and DINOv2 (layer scale, [CLS] + patch-mean head, SwiGLU,
resampled positions) against `transformers`.

The tiny models follow tests/test_convert_hf.py (2 layers, width 32, 16 x 16 images of
4 x 4 patches, 3 classes) and pass its checks: logits in fp32 (1e-4) and bf16 (2e-2 of
the largest logit), export that `from_pretrained` loads to the same logits, bit-identical
re-import. HF initialises DeiT's tokens and positions to zero and DINOv2's layer scales to
one constant, so those are perturbed too: a swapped or dropped tensor shows in the logits.
"""

from __future__ import annotations

import flax
import jax
import numpy as np
import pytest
import test_convert_hf as parity  # its tiny sizes, inputs and checks
import torch
import transformers
from conftest import make_tiny_config, param_shapes

from transformer import convert
from transformer.convert import dinov2
from transformer.nn import partitioning
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model, check, param_count
from transformer.train import experiment, finetune

DEIT, DINOV2 = "DeiTForImageClassificationWithTeacher", "Dinov2ForImageClassification"
SWIGLU = f"{DINOV2}-swiglu"  # DINOv2 giant's feed-forward, at the tiny size
D = parity.WIDTH
IMAGE = dict(image_size=16, patch_size=4, num_labels=3, **parity.COMMON, **parity.INIT)
CONSTANT = ("cls_token", "distillation_token", "position_embeddings", "lambda1")  # HF's init


def _deit():
  config = transformers.DeiTConfig(intermediate_size=parity.FFN, **IMAGE)
  return transformers.DeiTForImageClassificationWithTeacher(config)


def _dinov2(image_size: int = 16, **extra):
  options = {**IMAGE, "image_size": image_size, **extra}
  config = transformers.Dinov2Config(mlp_ratio=2, layerscale_value=0.5, **options)
  return transformers.Dinov2ForImageClassification(config)


BUILDERS = {DEIT: _deit, DINOV2: _dinov2, SWIGLU: lambda: _dinov2(use_swiglu_ffn=True)}


def _arch(name: str) -> str:
  return name.split("-")[0]


def _saved(build, seed: int, path):
  """`parity.saved`, with the tensors HF initialises to constants perturbed too."""
  model, path = parity.saved(build, seed, path)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(CONSTANT):
        p.add_(0.5 * torch.randn_like(p))
  model.save_pretrained(path)
  return model, path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """Name -> (the HF model in eval mode, its save_pretrained directory)."""
  return {
    name: _saved(build, 60 + i, tmp_path_factory.mktemp(name.replace("-", "_")))
    for i, (name, build) in enumerate(BUILDERS.items())
  }


@pytest.mark.parametrize("name", list(BUILDERS))
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(_arch(name), *checkpoints[name], tmp_path / "export")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_imported_options_and_parameter_counts(name, checkpoints):
  """The options each checkpoint brings, and our count = the real one = HF's (DINOv2's
  pretraining `mask_token` aside)."""
  model, path = checkpoints[name]
  config = convert.load(path)[0]
  expected = {
    DEIT: dict(vit_distillation_token=True, pooling="cls", layer_scale_init=None, max_len=18),
    DINOV2: dict(pooling="cls_mean", layer_scale_init=0.5, norm_eps=1e-6, d_ff=64),
    SWIGLU: dict(pooling="cls_mean", activation="swiglu", d_ff=48),  # HF: 2/3 of 64, up to 8
  }[name]
  assert {field: getattr(config, field) for field in expected} == expected
  hf = sum(p.numel() for n, p in model.named_parameters() if not n.endswith("mask_token"))
  real = sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(param_shapes(config)))
  assert param_count(config) == real == hf


def _edited(params, edit):
  """params (a {'params': ...} tree) with `edit(flat)` applied to its 'a/b' -> array dict."""
  flat = flax.traverse_util.flatten_dict(params["params"], sep="/")
  flat = {k: np.array(v) for k, v in flat.items()}
  edit(flat)
  return {"params": flax.traverse_util.unflatten_dict(flat, sep="/")}


def _drop_distillation_head(flat):
  for key in [k for k in flat if k.startswith("distillation_head/")]:
    flat[key] = np.zeros_like(flat[key])


def _swap_tokens(flat):
  flat["cls"], flat["distillation_token"] = flat["distillation_token"], flat["cls"]


def _drop_layer_scale(flat):
  for key in [k for k in flat if k.endswith("_scale")]:
    flat[key] = np.ones_like(flat[key])


def _drop_patch_mean(flat):  # the head's rows D: read the mean of the patch tokens
  flat["head/kernel"][D:] = 0.0


def _swap_gate_and_up(flat):
  for layer in ("layer_0", "layer_1"):
    for part in ("kernel", "bias"):
      gate, up = f"encoder/{layer}/ffn/wi_0/{part}", f"encoder/{layer}/ffn/wi_1/{part}"
      flat[gate], flat[up] = flat[up], flat[gate]


EDITS = {  # a new option undone: the logits move, so the parity tests above see the option
  "distillation-head-dropped": (DEIT, _drop_distillation_head),
  "cls-and-distillation-tokens-swapped": (DEIT, _swap_tokens),
  "layer-scale-dropped": (DINOV2, _drop_layer_scale),
  "patch-mean-dropped": (DINOV2, _drop_patch_mean),
  "swiglu-gate-and-up-swapped": (SWIGLU, _swap_gate_and_up),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_each_option_changes_the_logits(edit, checkpoints):
  name, change = EDITS[edit]
  model, path = checkpoints[name]
  arch, x = _arch(name), parity._inputs(_arch(name))
  want = parity._hf_logits(arch, model, x)
  config, params = convert.load(path)
  changed = parity._our_logits(arch, config, _edited(params, change), x)
  assert np.abs(changed - want).max() > 1e-2, edit  # far outside the parity tolerance


@pytest.mark.parametrize("g, grid", [(4, 6), (6, 4), (37, 16), (5, 5)])
def test_position_resampling_is_torchs_bicubic(g, grid):
  """DINOv2's 518 px table (37 x 37) at 224 px (16 x 16) among others, against PyTorch."""
  table = np.random.default_rng(g).normal(size=(1, 1 + g * g, 8)).astype(np.float32)
  got = dinov2.resample_positions(table, grid)
  square = torch.from_numpy(table[:, 1:]).reshape(1, g, g, 8).permute(0, 3, 1, 2)
  want = torch.nn.functional.interpolate(
    square, size=(grid, grid), mode="bicubic", align_corners=False
  )
  want = want.permute(0, 2, 3, 1).reshape(1, grid * grid, 8).numpy()
  assert got.dtype == np.float32 and got.shape == (1, 1 + grid * grid, 8)
  np.testing.assert_array_equal(got[:, 0], table[:, 0])  # [CLS] keeps its position
  # float64 here, float32 in PyTorch: a few ulp of values of order 1.
  np.testing.assert_allclose(got[:, 1:], want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("saved_size, size", [(16, 24), (24, 16)], ids=["up", "down"])
def test_dinov2_at_another_image_size_matches_hf(saved_size, size, tmp_path):
  """HF's DINOv2 resamples its position grid to the input; ours, loaded with that
  `image_size`, gives the same logits, and exports a table of that size."""
  model, path = _saved(lambda: _dinov2(saved_size), 70, tmp_path / "hf")
  rng = np.random.default_rng(1)
  x = {"images": rng.normal(size=(parity.B, size, size, 3)).astype(np.float32)}
  want = parity._hf_logits(DINOV2, model, x)
  tokens = (size // 4) ** 2 + 1
  config, params = convert.load(path, image_size=size, max_len=tokens)
  ours = parity._our_logits(DINOV2, config, params, x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  bf16 = convert.load(path, image_size=size, max_len=tokens, dtype="bfloat16")
  bound = 2e-2 * max(1.0, np.abs(want).max())
  np.testing.assert_allclose(parity._our_logits(DINOV2, *bf16, x), want, atol=bound, rtol=0)
  assert convert.load(path, image_size=size)[0] == config  # max_len follows the patch grid
  convert.save(tmp_path / "out", config, params, DINOV2)
  reloaded = transformers.Dinov2ForImageClassification.from_pretrained(tmp_path / "out").eval()
  assert reloaded.config.image_size == size
  np.testing.assert_allclose(parity._hf_logits(DINOV2, reloaded, x), ours, atol=1e-4, rtol=0)
  config2, params2 = convert.load(tmp_path / "out")
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def _image_run(path, field: str, size: int):
  """A config starting from the directory `path` with `config.{field}.image_size=size`."""
  config = experiment.default_config()
  config.init_from = f"hf:{path}"
  config.data.update(kind="image", source="sklearn_digits", tokenizer="none")
  config.model.num_classes = 3  # the checkpoints' head
  config[field].image_size = size
  return config


@pytest.mark.parametrize("field", ["data", "model"])
def test_a_run_at_another_image_size_starts_from_hfs_model_at_that_size(field, checkpoints):
  """`init_from='hf:DIR'` with 24 px images (DINOv2 saved at 16, patches of 4): the run's
  model with the weights `load_init_from` copies gives HF's logits at 24, where HF
  resamples its grid to the input. DeiT's table, not resampled, is refused in one line."""
  model, path = checkpoints[DINOV2]
  c = experiment.validate(_image_run(path, field, 24)).model
  assert (c.image_size, c.max_len, c.num_classes) == (24, 37, 3)  # 6 x 6 patches + [CLS]
  x = {"images": np.random.default_rng(2).normal(size=(parity.B, 24, 24, 3)).astype(np.float32)}
  fresh = jax.jit(build_model(c).init)(jax.random.key(0), x["images"][:1])["params"]
  params = finetune.load_init_from(f"hf:{path}", fresh, image_size=c.image_size)
  ours = parity._our_logits(DINOV2, c, {"params": params}, x)
  np.testing.assert_allclose(ours, parity._hf_logits(DINOV2, model, x), atol=1e-4, rtol=0)

  message = _one_line_error(experiment.validate, _image_run(checkpoints[DEIT][1], field, 24))
  assert f"config.{field}.image_size=24: differs from the checkpoint's image_size=16" in message
  assert message.endswith(": use 16"), message


def test_new_parameters_have_sharding_rules(checkpoints):
  config = convert.load(checkpoints[DEIT][1])[0].replace(layer_scale_init=1.0)
  axes = flax.traverse_util.flatten_dict(partitioning.logical_axes(param_shapes(config)), sep="/")
  assert axes["distillation_token"] == (None, None, "embed")
  assert axes["distillation_head/kernel"] == ("embed", None)
  assert axes["encoder/layer_0/self_attention_scale"] == ("embed",)
  assert axes["encoder/layer_1/ffn_scale"] == ("embed",)


COUNT_CASES = [  # the analytic count beyond the converted models
  dict(family="vit", vit_distillation_token=True, layer_scale_init=0.1, position="none"),
  dict(family="vit", pooling="cls_mean", parallel_residual=True, layer_scale_init=1.0),
  dict(family="seq2seq", layer_scale_init=1e-5, norm_position="sandwich"),
  dict(family="decoder", layer_scale_init=0.5, scan_layers=True, moe_experts=2),
]


@pytest.mark.parametrize("case", COUNT_CASES, ids=lambda c: c["family"])
def test_parameter_count_of_the_new_options(case):
  c = make_tiny_config(**case)
  assert param_count(c) == sum(np.prod(x.shape) for x in jax.tree.leaves(param_shapes(c)))


def _one_line_error(fn, *args, **kwargs) -> str:
  with pytest.raises(ValueError) as e:
    fn(*args, **kwargs)
  message = str(e.value)
  assert "\n" not in message, message
  return message


def test_config_refusals_are_one_line():
  vit = make_tiny_config("vit")
  cases = [
    (dict(vit_distillation_token=True, pooling="mean"), "vit_distillation_token=True: needs"),
    (dict(vit_distillation_token=1), "vit_distillation_token=1: must be True or False"),
    (dict(layer_scale_init=float("inf")), "layer_scale_init=inf: must be a finite number"),
    (dict(layer_scale_init="small"), "layer_scale_init='small': must be a finite number"),
  ]
  for changes, what in cases:
    assert f"ModelConfig.{what}" in _one_line_error(lambda ch=changes: check(vit.replace(**ch)))
  decoder = make_tiny_config("decoder")
  message = _one_line_error(decoder.replace, vit_distillation_token=True)
  assert "ModelConfig.vit_distillation_token=True: is a ViT (DeiT) token" in message
  encoder = ModelConfig(family="encoder", num_classes=2, pooling="cls_mean")
  message = _one_line_error(check, encoder)  # the encoder family's own rule
  assert "ModelConfig.pooling='cls_mean': cls_mean is a ViT head" in message


def test_converter_refusals_are_one_line(checkpoints, tmp_path):
  _, deit_path = checkpoints[DEIT]
  _, dinov2_path = checkpoints[DINOV2]

  def drop_path(c):
    c["drop_path_rate"] = 0.1

  def plain_deit(c):
    c["architectures"] = ["DeiTForImageClassification"]

  for edit, what in (
    (drop_path, f"{DINOV2}: drop_path_rate=0.1 is not supported"),
    (plain_deit, "'DeiTForImageClassification' is not supported (supported: "),
  ):
    path = dinov2_path if edit is drop_path else deit_path
    bad = parity._rewrite(path, tmp_path / edit.__name__, edit_config=edit)
    assert what in _one_line_error(convert.load, bad)
  # Only DINOv2's table is resampled (HF's DeiT needs interpolate_pos_encoding=True).
  message = _one_line_error(convert.load, deit_path, image_size=24, max_len=38)
  assert "load: image_size=24 differs from the checkpoint's 16, and " in message
  assert f"{DEIT} does not resample its learned positions: use 16" in message
  # A ViT's max_len moves with its patch grid only: at the same image_size it is refused.
  message = _one_line_error(convert.load, dinov2_path, max_len=37)
  assert "load: max_len=37 differs from the checkpoint's 17 learned positions" in message

  deit, deit_params = convert.load(deit_path)
  dino, dino_params = convert.load(dinov2_path)
  out = tmp_path / "out"
  message = _one_line_error(convert.save, out, deit, deit_params, DINOV2)
  assert f"{DINOV2}: ModelConfig.layer_scale_init=None is not supported" in message
  message = _one_line_error(convert.save, out, dino, dino_params, "ViTForImageClassification")
  assert "ViTForImageClassification cannot express" in message
  assert "ModelConfig.pooling='cls_mean'" in message
  message = _one_line_error(convert.save, out, dino, dino_params, DEIT)
  assert f"{DEIT} cannot express" in message and "vit_distillation_token=False" in message
  message = _one_line_error(convert.save, out, dino.replace(d_ff=50), dino_params, DINOV2)
  assert f"{DINOV2}: ModelConfig.d_ff=50 is not supported" in message
