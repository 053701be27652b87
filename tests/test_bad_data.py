"""Bad data: empty, binary, non-UTF-8, huge-line, truncated-gzip and wrong-shape inputs.

Every builder and tokenizer reader fails naming the file (and line), or handles the input
as documented. (tests/test_data_errors.py holds the other cases.)"""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest

from transformer.data.tokenizers import load_tokenizer


def _write(path, data: bytes):
  path.write_bytes(data)
  return path


def _idx(array: np.ndarray) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  return header + array.astype(np.uint8).tobytes()


def _mnist_dir(root, images, labels, test_images=None):
  from transformer.data import image_builders

  root.mkdir()
  arrays = [images, labels, images if test_images is None else test_images, labels]
  for name, array in zip(image_builders.MNIST_FILES, arrays, strict=True):
    (root / name).write_bytes(gzip.compress(array if isinstance(array, bytes) else _idx(array)))
  return root


_TSV = "en\tes\n" + "".join(f"hello {i}\thola {i}\n" for i in range(40))
_CSV = "text,label\n" + "".join(f"text {i},{'pos' if i % 2 else 'neg'}\n" for i in range(40))


def _bad_inputs(tmp):
  """(name, callable, regex of the error): each input fails naming its file (and line)."""
  from transformer.data import builders, image_builders

  text = lambda p: builders.text_corpus(p, tmp / "tfds")
  pairs = lambda p: builders.sentence_pairs(p, ["en", "es"], tmp / "tfds")
  labelled = lambda p: builders.labelled_text(p, "text", "label", tmp / "tfds")
  idx = lambda p: image_builders.idx_images(p, tmp / "tfds")
  binary = bytes(range(128, 256)) * 20  # no valid UTF-8 start byte
  truncated = lambda s: gzip.compress(s.encode())[:-12]
  images = np.zeros((20, 4, 4), np.uint8)
  labels = np.arange(20) % 3
  w = lambda name, data: _write(tmp / name, data)
  test_size = np.zeros((20, 5, 5), np.uint8)
  return [
    ("text truncated gzip", text, w("a.txt.gz", truncated("line\n" * 99)), "not a valid gzip"),
    ("text binary", text, w("b.txt", binary), r":1: invalid UTF-8"),
    ("text empty gzip", text, w("c.txt.gz", gzip.compress(b"")), "empty corpus"),
    ("pairs truncated gzip", pairs, w("p.tsv.gz", truncated(_TSV)), "not a valid gzip"),
    ("pairs binary", pairs, w("p2.tsv", binary), r":1: invalid UTF-8"),
    ("pairs bad byte", pairs, w("p3.tsv", _TSV.encode() + b"caf\xe9\tx\n"), r":42: invalid UTF-8"),
    ("pairs header only", pairs, w("p4.tsv", b"en\tes\n"), "no data rows"),
    ("labelled truncated gzip", labelled, w("l.csv.gz", truncated(_CSV)), "not a valid gzip"),
    ("labelled binary", labelled, w("l2.csv", binary), r":1: invalid UTF-8"),
    ("labelled bad byte", labelled, w("l3.csv", _CSV.encode() + b"\xff,pos\n"), r":42: invalid"),
    (
      "labelled open quote",
      labelled,
      w("l4.csv", (_CSV + '"x,y\n' + _CSV).encode()),
      r":42: expected",
    ),
    ("idx empty", idx, _mnist_dir(tmp / "m1", b"", labels), r"idx3-ubyte.gz: not an IDX file"),
    ("idx label count", idx, _mnist_dir(tmp / "m2", images, labels[:7]), r"\(7,\) labels for 20"),
    ("idx 2-D images", idx, _mnist_dir(tmp / "m3", images.reshape(20, 16), labels), r"\[N, H, W\]"),
    ("idx test size", idx, _mnist_dir(tmp / "m4", images, labels, test_size), r"shape \(4, 4, 1\)"),
  ]


def test_bad_data_files_fail_naming_file_and_line(tmp_path):
  for name, build, path, pattern in _bad_inputs(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + pattern) as error:
      build(path)
    assert "\n" not in str(error.value), name


def test_huge_lines_and_binary_images(tmp_path):
  """A 1 MB line in a text corpus is cut into chunks (documented: `chunk_chars`); an image
  file that is not an image fails naming it."""
  from PIL import Image

  from transformer.data import builders, image_builders

  corpus = tmp_path / "huge.txt"
  corpus.write_text("x" * 1_000_000 + "\n" + "an ordinary line\n" * 30_000)
  builder = builders.text_corpus(corpus, tmp_path / "tfds")
  assert builder.info.splits["train"].num_examples > 1_000_000 // 16384
  for label in ("a", "b"):
    (tmp_path / "imgs" / label).mkdir(parents=True)
    for i in range(3):
      Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "imgs" / label / f"{i}.png")
  _write(tmp_path / "imgs" / "b" / "bad.png", bytes(range(256)) * 4)
  with pytest.raises(
    ValueError, match=re.escape(str(tmp_path / "imgs/b/bad.png")) + ": cannot read"
  ):
    image_builders.image_folder(tmp_path / "imgs", tmp_path / "tfds")


def test_table_field_over_csv_limit_names_file_and_line(tmp_path):
  from transformer.data import builders

  path = _write(tmp_path / "long.tsv", (_TSV + "a" * 200_000 + "\tb\n").encode())
  with pytest.raises(ValueError, match=re.escape(str(path)) + ":42"):
    builders.sentence_pairs(path, ["en", "es"], tmp_path / "tfds")


@pytest.mark.parametrize(
  ("name", "content"),
  [
    ("char_vocab.json", b""),
    ("char_vocab.json", bytes(range(128, 256))),
    ("char_vocab.json", b'{"kind": "char", "specials": ['),
    ("char_vocab.json", b"[1, 2]"),
    (
      "char_vocab.json",
      b'{"kind": "char", "specials": ["<pad>", "<bos>", "<eos>", "<unk>", '
      b'"[MASK]", "[CLS]", "[SEP]"]}',
    ),
    ("spm_unigram_64.model", bytes(range(256))),
    ("spm_unigram_64.model", b""),
  ],
  ids=["empty", "binary", "truncated", "list", "no-code-points", "spm-garbage", "spm-empty"],
)
def test_tokenizer_file_errors_name_the_file(tmp_path, name, content):
  path = _write(tmp_path / name, content)
  with pytest.raises(ValueError, match=re.escape(str(path))):
    load_tokenizer(path)
