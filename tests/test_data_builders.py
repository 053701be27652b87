"""The local TFDS builders: each prepared dataset gives back its source exactly."""

import gzip
import zlib
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from transformer.data import builders, files, image_builders

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "data" / "tinyshakespeare.txt.gz"
BIBLE = REPO / "data" / "bible_kjv_rv1909_en_es.tsv.gz"
FASHION = REPO / "data" / "fashion-mnist"
SPLIT_ORDER = ("train", "validation", "test")


def _joined(builder) -> str:
  sources = builder.as_data_source()
  return "".join(
    sources[s][i]["text"].decode()
    for s in SPLIT_ORDER
    if s in sources
    for i in range(len(sources[s]))
  )


def test_text_corpus_folder_round_trips_with_lines(tmp_path):
  root = tmp_path / "corpus"
  (root / "sub").mkdir(parents=True)
  a = "".join(f"line {i} é ✓\n" for i in range(1, 301))
  b = "tail without newline\nsecond line"
  (root / "a.txt").write_text(a, encoding="utf-8")
  (root / "sub" / "b.txt.gz").write_bytes(gzip.compress(b.encode()))
  (root / "ignored.md").write_text("not text corpus")
  builder = builders.text_corpus(
    root, tmp_path / "tfds", validation_fraction=0.1, test_fraction=0.1, chunk_chars=200
  )
  assert _joined(builder) == a + b
  sources = builder.as_data_source()
  assert {s: len(sources[s]) > 1 for s in SPLIT_ORDER} == dict.fromkeys(SPLIT_ORDER, True)
  for split in SPLIT_ORDER:
    for i in range(len(sources[split])):
      ex = sources[split][i]
      text, name, line = ex["text"].decode(), ex["file"].decode(), int(ex["line"])
      assert len(text) <= 200
      source_lines = (a if name == "a.txt" else b).split("\n")
      assert text.split("\n")[0] == source_lines[line - 1][: len(text.split("\n")[0])]
  # Splits are contiguous and start at line starts.
  first_val = sources["validation"][0]
  assert first_val["text"].decode().startswith("line ") and first_val["line"] > 1


def test_text_corpus_shipped_shakespeare_round_trips(tmp_path):
  builder = builders.text_corpus(SHAKESPEARE, tmp_path)
  original = gzip.decompress(SHAKESPEARE.read_bytes()).decode()
  assert len(original) == 1_115_394
  assert _joined(builder) == original
  # Same data and settings: the prepared dataset is reused, and it is readable by name.
  again = builders.text_corpus(SHAKESPEARE, tmp_path)
  assert again.builder_config.name == builder.builder_config.name
  by_name = tfds.data_source(
    f"local_text_corpus/{builder.builder_config.name}", split="validation", data_dir=tmp_path
  )
  assert len(by_name) == len(builder.as_data_source()["validation"])


def test_text_corpus_fingerprint_changes_with_content(tmp_path):
  p = tmp_path / "t.txt"
  p.write_text("one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n" * 5)
  first = builders.text_corpus(p, tmp_path / "tfds").builder_config.name
  p.write_text("changed\n" * 60)
  second = builders.text_corpus(p, tmp_path / "tfds")
  assert second.builder_config.name != first
  assert _joined(second) == "changed\n" * 60


def test_sentence_pairs_round_trip_and_hash_split(tmp_path):
  rows = [(str(i), f"source {i}", f"fuente {i} ñ") for i in range(200)]
  p = tmp_path / "pairs.tsv"
  p.write_text("id\ten\tes\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
  builder = builders.sentence_pairs(
    p, ["en", "es"], tmp_path / "tfds", validation_fraction=0.1, test_fraction=0.1
  )
  sources = builder.as_data_source()
  seen = {}
  for split in SPLIT_ORDER:
    for i in range(len(sources[split])):
      ex = sources[split][i]
      seen[int(ex["line"])] = (split, ex["en"].decode(), ex["es"].decode())
  assert sorted(seen) == list(range(2, 202))  # line 1 is the header
  for line, (split, en, es) in seen.items():
    assert (en, es) == rows[line - 2][1:]
    assert split == builders.hash_split(en, 0.1, 0.1)
  assert all(len(sources[s]) > 0 for s in SPLIT_ORDER)


def test_sentence_pairs_shipped_bible(tmp_path):
  builder = builders.sentence_pairs(BIBLE, ["en", "es"], tmp_path)
  sources = builder.as_data_source()
  assert sum(len(sources[s]) for s in SPLIT_ORDER) == 31_150
  rows = dict(files.read_table(BIBLE, ["en", "es"]))
  assert len(rows) == 31_150
  for split in SPLIT_ORDER:  # A sample of each split matches its source row.
    for ex in sources[split].__getitems__(list(range(0, len(sources[split]), 97))):
      assert rows[int(ex["line"])] == {"en": ex["en"].decode(), "es": ex["es"].decode()}
      assert builders.hash_split(ex["en"].decode(), 0.05, 0.05) == split


def test_labelled_text_names_and_ids(tmp_path):
  p = tmp_path / "labelled.csv"
  p.write_text('text,label\n"hello, world",pos\nbad day,neg\n"quote ""x""",pos\nmeh,neutral\n')
  builder = builders.labelled_text(
    p, "text", "label", tmp_path / "tfds", validation_fraction=0.0, test_fraction=0.0
  )
  assert builder.info.features["label"].names == ["neg", "neutral", "pos"]
  train = builder.as_data_source()["train"]
  got = {train[i]["text"].decode(): int(train[i]["label"]) for i in range(len(train))}
  assert got == {"hello, world": 2, "bad day": 0, 'quote "x"': 2, "meh": 1}
  named = builders.labelled_text(
    p,
    "text",
    "label",
    tmp_path / "tfds",
    label_names=["pos", "neg", "neutral"],
    validation_fraction=0.0,
    test_fraction=0.0,
  )
  train = named.as_data_source()["train"]
  assert {train[i]["text"].decode(): int(train[i]["label"]) for i in range(len(train))}["meh"] == 2


def _write_idx(path: Path, array: np.ndarray) -> None:
  codes = {np.dtype(np.uint8): 0x08}
  header = bytes([0, 0, codes[array.dtype], array.ndim]) + np.array(array.shape, ">u4").tobytes()
  data = header + array.tobytes()
  path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def test_idx_images_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  train_x = rng.integers(0, 256, (50, 5, 4), dtype=np.uint8)
  train_y = rng.integers(0, 3, 50).astype(np.uint8)
  test_x = rng.integers(0, 256, (7, 5, 4), dtype=np.uint8)
  test_y = rng.integers(0, 3, 7).astype(np.uint8)
  names = ("a-img.gz", "a-lbl", "b-img", "b-lbl.gz")
  for name, arr in zip(names, (train_x, train_y, test_x, test_y), strict=True):
    _write_idx(tmp_path / name, arr)
  builder = image_builders.idx_images(
    tmp_path,
    tmp_path / "tfds",
    file_names=names,
    label_names=("x", "y", "z"),
    validation_fraction=0.2,
  )
  src = builder.as_data_source()
  assert (len(src["train"]), len(src["validation"]), len(src["test"])) == (40, 10, 7)
  got_x = np.stack(
    [src[s][i]["image"] for s in ("train", "validation") for i in range(len(src[s]))]
  )
  got_y = [src[s][i]["label"] for s in ("train", "validation") for i in range(len(src[s]))]
  np.testing.assert_array_equal(got_x, train_x[..., None])
  np.testing.assert_array_equal(got_y, train_y)
  np.testing.assert_array_equal(src["test"][6]["image"], test_x[6][..., None])
  assert builder.info.features["label"].names == ["x", "y", "z"]


def test_shipped_fashion_mnist_files_are_intact():
  images = files.read_idx(FASHION / "t10k-images-idx3-ubyte.gz")
  labels = files.read_idx(FASHION / "t10k-labels-idx1-ubyte.gz")
  assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
  assert np.bincount(labels).tolist() == [1000] * 10
  assert image_builders._idx_header_shape(FASHION / "train-images-idx3-ubyte.gz") == (
    60_000,
    28,
    28,
  )


def _png(path: Path, array: np.ndarray) -> None:
  from PIL import Image

  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(array).save(path)


def test_image_folder_with_split_folders_round_trips(tmp_path):
  rng = np.random.default_rng(1)
  expected = {}
  for split in ("train", "test"):
    for cls in ("cat", "dog"):
      for k in range(3):
        arr = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
        rel = f"{split}/{cls}/{k}.png"
        _png(tmp_path / "imgs" / rel, arr)
        expected[rel] = (arr, cls)
  builder = image_builders.image_folder(tmp_path / "imgs", tmp_path / "tfds")
  src = builder.as_data_source()
  names = builder.info.features["label"].names
  assert names == ["cat", "dog"] and set(src) == {"train", "test"}
  for split in ("train", "test"):
    for i in range(len(src[split])):
      ex = src[split][i]
      arr, cls = expected[ex["file"].decode()]
      np.testing.assert_array_equal(ex["image"], arr)
      assert names[ex["label"]] == cls


def test_image_folder_flat_layout_hash_split_and_grey(tmp_path):
  for cls in ("a", "b"):
    for k in range(20):
      _png(tmp_path / "flat" / cls / f"{k}.png", np.full((4, 4), k, np.uint8))
  builder = image_builders.image_folder(tmp_path / "flat", tmp_path / "tfds", test_fraction=0.25)
  src = builder.as_data_source()
  files_by_split = {s: {src[s][i]["file"].decode() for i in range(len(src[s]))} for s in src}
  assert set(src) == {"train", "test"} and sum(map(len, files_by_split.values())) == 40
  for split, names in files_by_split.items():
    for name in names:
      u = zlib.crc32(name.encode()) / 2**32
      assert (u < 0.25) == (split == "test")
  assert src["train"][0]["image"].shape == (4, 4, 1)
