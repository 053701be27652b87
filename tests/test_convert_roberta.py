"""RoBERTa (`RobertaForMaskedLM`, `RobertaForSequenceClassification`) against `transformers`.

The tiny models follow tests/test_convert_hf.py (width 32, 2 layers, vocabulary 100,
perturbed norms and biases) with RoBERTa's own details: PAD 1, one token type,
`layer_norm_eps=1e-5`, `max_position_embeddings` = 64 + 2. They pass the same checks:
logits on padded inputs in fp32 and bf16 (HF numbering the positions itself from the PAD
tokens), export that `from_pretrained` loads to the same logits, bit-identical re-import.
The position offset is shown to matter, left padding and another `pad_token_id` to match,
and the options we lack to be refused in one line.
"""

from __future__ import annotations

import json
import re

import flax
import numpy as np
import pytest
import test_convert_hf as parity  # its tiny sizes, inputs and checks
import transformers
from safetensors.numpy import load_file

from transformer import convert
from transformer.convert import hf, roberta

MLM, CLASSIFIER = roberta.MLM, roberta.CLASSIFIER
V, FFN, MAX_LEN = parity.VOCAB, parity.FFN, parity.MAX_LEN
TABLE = "roberta.embeddings.position_embeddings.weight"


def _config(**extra):
  return transformers.RobertaConfig(
    vocab_size=V, intermediate_size=FFN, max_position_embeddings=MAX_LEN + 2, type_vocab_size=1,
    layer_norm_eps=1e-5, **parity.COMMON, **parity.INIT, **extra,
  )  # fmt: skip


# name -> (architecture, builder). The untied head's FFN is tanh GELU: its head stays exact.
BUILDERS = {
  "mlm": (MLM, lambda: transformers.RobertaForMaskedLM(_config())),
  "mlm_untied": (
    MLM,
    lambda: transformers.RobertaForMaskedLM(
      _config(tie_word_embeddings=False, hidden_act="gelu_new")
    ),
  ),
  "classifier": (
    CLASSIFIER,
    lambda: transformers.RobertaForSequenceClassification(_config(num_labels=3)),
  ),
  "pad_0": (MLM, lambda: transformers.RobertaForMaskedLM(_config(pad_token_id=0, bos_token_id=2))),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (the HF model in eval mode, its save_pretrained directory)."""
  return {
    name: parity.saved(build, 40 + i, tmp_path_factory.mktemp(name))
    for i, (name, (_, build)) in enumerate(BUILDERS.items())
  }


@pytest.mark.parametrize("name", ["mlm", "mlm_untied", "classifier"])
def test_import_matches_hf_and_export_round_trips(name, checkpoints, tmp_path):
  parity.check_parity_and_round_trip(BUILDERS[name][0], *checkpoints[name], tmp_path / "export")


def test_config_and_export_carry_roberta_s_ids_and_offset(checkpoints, tmp_path):
  config, params = convert.load(checkpoints["mlm"][1])
  assert (config.max_len, config.type_vocab_size, config.norm_eps) == (MAX_LEN, 1, 1e-5)
  assert config.tie_embeddings and config.family == "encoder" and config.num_classes == 0
  untied = convert.load(checkpoints["mlm_untied"][1])[0]
  assert not untied.tie_embeddings and untied.activation == "gelu_tanh"
  assert convert.load(checkpoints["classifier"][1])[0].num_classes == 3

  convert.save(tmp_path / "out", config, params, MLM)
  written = json.loads((tmp_path / "out" / hf.CONFIG).read_text())
  assert written["model_type"] == "roberta" and written["max_position_embeddings"] == MAX_LEN + 2
  assert (written["pad_token_id"], written["bos_token_id"], written["eos_token_id"]) == (1, 0, 2)
  table = load_file(tmp_path / "out" / hf.WEIGHTS)[TABLE]
  assert table.shape == (MAX_LEN + 2, parity.WIDTH) and not table[:2].any()
  ours = params["params"]["encoder"]["embedder"]["positions"]["embedding"]
  np.testing.assert_array_equal(table[2:], ours)
  np.testing.assert_array_equal(ours, load_file(checkpoints["mlm"][1] / hf.WEIGHTS)[TABLE][2:])


def _with_table(params, table):
  """`params` with another position table (the other arrays shared)."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  flat["params/encoder/embedder/positions/embedding"] = table
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def test_the_position_offset_matters(checkpoints):
  """Rows 0..63 (no offset) instead of 2..65 give other logits: the parity above tests it."""
  model, path = checkpoints["mlm"]
  x = parity._inputs(MLM)
  want = parity._real(MLM, parity._hf_logits(MLM, model, x), x)
  config, params = convert.load(path)
  ours = parity._real(MLM, parity._our_logits(MLM, config, params, x), x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  no_offset = _with_table(params, load_file(path / hf.WEIGHTS)[TABLE][:MAX_LEN])
  wrong = parity._real(MLM, parity._our_logits(MLM, config, no_offset, x), x)
  assert np.abs(wrong - want).max() > 0.1


def _left_padded():
  """Row 1 left-padded by 3 PAD (1) tokens, every row starting with <s> (0)."""
  x = parity._inputs(MLM)
  mask = x["mask"]
  mask[1, :3] = 0
  tokens = np.where(mask > 0, x["tokens"], roberta.PAD)
  first = mask.argmax(1)
  tokens[np.arange(len(tokens)), first] = roberta.BOS
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  return x | {"tokens": tokens, "mask": mask, "positions": positions}


@pytest.mark.parametrize("name", ["mlm", "classifier"])
def test_left_padding_matches_with_hf_s_positions(name, checkpoints):
  """HF restarts the positions after left padding (cumsum of the non-PAD tokens): ours match
  given `cumsum(mask) - 1`, not with the default 0..T-1. The classifier reads token 0,
  which is PAD in the left-padded row: compared on the other rows."""
  arch = BUILDERS[name][0]
  model, path = checkpoints[name]
  x = _left_padded()
  config, params = convert.load(path)
  rows = x["mask"][:, 0] > 0 if arch == CLASSIFIER else slice(None)
  want = parity._real(arch, parity._hf_logits(arch, model, x)[rows], x)
  ours = parity._real(arch, parity._our_logits(arch, config, params, x)[rows], x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  if arch == MLM:
    default = parity._real(
      arch, parity._our_logits(arch, config, params, x | {"positions": None}), x
    )
    assert np.abs(default - want).max() > 0.1  # the left-padded row's positions are off by 3


def test_another_pad_token_id_imports_with_its_offset(checkpoints):
  """pad_token_id=0: HF numbers the real tokens from 1, so ours are rows 1..64."""
  model, path = checkpoints["pad_0"]
  config, params = convert.load(path)
  assert config.max_len == MAX_LEN + 1
  x = parity._inputs(MLM)
  x["tokens"] = np.where(x["mask"] > 0, x["tokens"], 0)  # PAD 0 (real tokens are 2..99)
  want = parity._real(MLM, parity._hf_logits(MLM, model, x), x)
  ours = parity._real(MLM, parity._our_logits(MLM, config, params, x), x)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
  table = params["params"]["encoder"]["embedder"]["positions"]["embedding"]
  np.testing.assert_array_equal(table, load_file(path / hf.WEIGHTS)[TABLE][1:])


def _edited(src, dst, **changes):
  dst.mkdir()
  for f in src.iterdir():
    (dst / f.name).write_bytes(f.read_bytes())
  config = json.loads((dst / hf.CONFIG).read_text())
  (dst / hf.CONFIG).write_text(json.dumps(config | changes))
  return dst


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"is_decoder": True}, "is_decoder=True"),
    ({"add_cross_attention": True}, "add_cross_attention=True"),
    ({"pad_token_id": None}, "pad_token_id=None"),
    ({"hidden_act": "silu"}, "hidden_act='silu'"),
  ],
)
def test_options_we_lack_are_refused_in_one_line(changes, message, checkpoints, tmp_path):
  bad = _edited(checkpoints["mlm"][1], tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=re.escape(f"{MLM}: {message} is not supported")) as e:
    convert.load(bad)
  assert "\n" not in str(e.value)


def test_a_position_table_without_padding_rows_is_a_shape_error(checkpoints, tmp_path):
  """A config.json whose max_position_embeddings exceeds the table: our max_len 98 > 66 rows."""
  bad = _edited(checkpoints["mlm"][1], tmp_path / "bad", max_position_embeddings=100)
  with pytest.raises(ValueError) as e:
    convert.load(bad)
  message = str(e.value)
  assert f"'{TABLE}' has shape [66, 32]" in message and "needs [100, 32]" in message
  assert "encoder/embedder/positions/embedding [98, 32]" in message and "\n" not in message


def test_another_max_len_at_load_is_one_line(checkpoints):
  """Which rows a shorter learned table keeps is not load's to guess (RoBERTa's offset)."""
  _, path = checkpoints["mlm"]
  with pytest.raises(ValueError, match=r"load: max_len=16 differs from the checkpoint's") as e:
    convert.load(path, max_len=16)
  assert "\n" not in str(e.value)
