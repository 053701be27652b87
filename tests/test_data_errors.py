"""Bad input fails loudly, naming the file (and line), before any batch is produced."""

import gzip
import re

import numpy as np
import pytest

from transformer import tasks
from transformer.data import (
  DataConfig,
  DataContext,
  builders,
  files,
  image_builders,
  make_datasets,
  pipeline,
  sources,
)
from transformer.data.tokenizers import ByteTokenizer
from transformer.nn.config import ModelConfig


def _spec(cfg):
  """The data spec of the task `cfg.kind` names."""
  return tasks.get(cfg.kind)().data_spec()


def _at(path, line=None):
  """A regex matching `path` or `path:line` in a message."""
  return re.escape(f"{path}:{line}" if line else str(path))


def test_missing_file_and_folder(tmp_path):
  missing = tmp_path / "nope.txt"
  with pytest.raises(FileNotFoundError, match=_at(missing)):
    builders.text_corpus(missing, tmp_path / "tfds")
  with pytest.raises(FileNotFoundError, match=_at(tmp_path / "no_dir")):
    image_builders.image_folder(tmp_path / "no_dir", tmp_path / "tfds")
  for name in image_builders.MNIST_FILES[:2]:
    (tmp_path / name).write_bytes(b"")
  with pytest.raises(FileNotFoundError, match=_at(tmp_path / image_builders.MNIST_FILES[2])):
    image_builders.idx_images(tmp_path, tmp_path / "tfds")
  cfg = DataConfig(path=str(missing), data_dir=str(tmp_path / "tfds"))
  with pytest.raises(FileNotFoundError, match=_at(missing)):
    make_datasets(cfg, _spec(cfg), tmp_path, 4, 8, 0, 0, 1)


def test_empty_corpus_and_empty_folder(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n\t\n")
  with pytest.raises(ValueError, match=_at(empty) + ": empty corpus"):
    builders.text_corpus(empty, tmp_path / "tfds")
  (tmp_path / "folder").mkdir()
  with pytest.raises(ValueError, match=_at(tmp_path / "folder") + ": folder holds no"):
    builders.text_corpus(tmp_path / "folder", tmp_path / "tfds")


def test_undecodable_bytes_name_file_and_line(tmp_path):
  bad = tmp_path / "bad.txt.gz"
  bad.write_bytes(gzip.compress(b"fine line\nsecond \xff\xfe line\n"))
  with pytest.raises(ValueError, match=_at(bad, 2) + r": invalid UTF-8 .* column 8"):
    builders.text_corpus(bad, tmp_path / "tfds")


def test_malformed_table_rows(tmp_path):
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("en\tes\tnote\na\tb\tc\nonly\ttwo\nx\ty\tz\n")
  with pytest.raises(ValueError, match=_at(tsv, 3) + ": expected 3 fields"):
    builders.sentence_pairs(tsv, ["en", "es"], tmp_path / "tfds")
  with pytest.raises(ValueError, match=_at(tsv, 1) + r": header .* lacks column\(s\) \['fr'\]"):
    builders.sentence_pairs(tsv, ["en", "fr"], tmp_path / "tfds")
  labelled = tmp_path / "labelled.csv"
  labelled.write_text('text,label\ngood,pos\n"multi\nline",neg\nodd,maybe\n')
  with pytest.raises(ValueError, match=_at(labelled, 5) + ": label 'maybe' is not one of"):
    builders.labelled_text(labelled, "text", "label", tmp_path / "tfds", label_names=["neg", "pos"])
  empty = tmp_path / "empty.tsv"
  empty.write_text("")
  with pytest.raises(ValueError, match=_at(empty) + ": empty file"):
    list(files.read_table(empty, ["en"]))


def test_images_of_inconsistent_size(tmp_path):
  from PIL import Image

  for name, size in (("a/1.png", (4, 4)), ("a/2.png", (4, 4)), ("b/3.png", (5, 4))):
    (tmp_path / "imgs" / name).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros(size, np.uint8)).save(tmp_path / "imgs" / name)
  with pytest.raises(
    ValueError, match=_at(tmp_path / "imgs" / "b" / "3.png") + r": image is \(5, 4, 1\)"
  ):
    image_builders.image_folder(tmp_path / "imgs", tmp_path / "tfds")
  (tmp_path / "imgs" / "b" / "3.png").write_bytes(b"not a png")
  with pytest.raises(
    ValueError, match=_at(tmp_path / "imgs" / "b" / "3.png") + ": cannot read image"
  ):
    image_builders.image_folder(tmp_path / "imgs", tmp_path / "tfds")


def test_corrupt_idx(tmp_path):
  junk = tmp_path / "junk.idx"
  junk.write_bytes(b"\x01\x02\x03\x04rest")
  with pytest.raises(ValueError, match=_at(junk) + ": not an IDX file"):
    files.read_idx(junk)
  short = tmp_path / "short.idx"
  short.write_bytes(bytes([0, 0, 8, 1]) + np.array([10], ">u4").tobytes() + b"\x00" * 9)
  with pytest.raises(ValueError, match=_at(short) + r": IDX header says shape \(10,\)"):
    files.read_idx(short)


def _pairs(tmp_path, long_line):
  rows = [f"{k} short\t{k} corta" for k in range(40)]
  rows[long_line - 2] = "a much longer source sentence than the rest\tcorta"
  path = tmp_path / "pairs.tsv"
  path.write_text("en\tes\n" + "\n".join(rows) + "\n")
  return path


def test_overlong_example_with_error_policy_names_file_and_line(tmp_path):
  path = _pairs(tmp_path, long_line=7)
  cfg = DataConfig(
    kind="seq2seq", source="pairs", path=str(path), tokenizer="byte", overlong="error",
    validation_fraction=0.0, test_fraction=0.0, eval_split="train", data_dir=str(tmp_path / "tfds"),
  )  # fmt: skip
  with pytest.raises(ValueError, match=_at(path, 7) + ": too long for the row"):
    make_datasets(cfg, _spec(cfg), tmp_path, 4, 16, 0, 0, 1)
  # The same check inside the pipeline (records the up-front scan did not sample).
  builder = builders.sentence_pairs(
    path, ["en", "es"], tmp_path / "tfds", validation_fraction=0.0, test_fraction=0.0
  )
  split = builder.as_data_source()["train"]
  splits = sources.Splits(train=split, eval=split, name=str(path), key="")
  loader = pipeline.Loader(process_index=0, process_count=1, overlong="error")
  ds = _spec(cfg).build(DataContext(cfg, splits, ByteTokenizer(), 16, 16, 0, loader), True, 2)
  with pytest.raises(
    ValueError, match=_at(path, 7) + r" \(en\): 43 tokens exceed the sequence length 15"
  ):
    for _ in ds:
      pass


def test_config_errors(tmp_path):
  with pytest.raises(ValueError, match="unknown field"):
    DataConfig.from_mapping({"kind": "lm", "seq_length": 5})
  with pytest.raises(ValueError, match="data.kind='vision': must be one of lm, mlm"):
    tasks.get("vision")
  with pytest.raises(ValueError, match="data.tokenizer='char': must be 'none' for image tasks"):
    tasks.get("image")().check(ModelConfig(family="vit", num_classes=2), DataConfig(source="idx"))
  corpus = tmp_path / "c.txt"
  corpus.write_text("hello there\n" * 50)
  base = DataConfig(path=str(corpus), data_dir=str(tmp_path / "tfds"))
  with pytest.raises(ValueError, match=r"no split 'dev'; prepared splits"):
    make_datasets(base.replace(eval_split="dev"), _spec(base), tmp_path, 4, 8, 0, 0, 1)
  with pytest.raises(ValueError, match="not divisible by process_count 3"):
    make_datasets(base, _spec(base), tmp_path, 4, 8, 0, 0, 3)
  with pytest.raises(ValueError, match="too few for windows"):
    make_datasets(base, _spec(base), tmp_path, 4, 100, 0, 0, 1)
  with pytest.raises(FileNotFoundError, match="TFDS dataset 'lm1b' is not prepared"):
    make_datasets(
      DataConfig(source="tfds", path="lm1b", data_dir=str(tmp_path / "empty")),
      _spec(DataConfig()),
      tmp_path,
      4,
      8,
      0,
      0,
      1,
    )
