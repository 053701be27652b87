"""grain pipelines through `make_datasets`: batch format, determinism, resume, host shards."""

import gzip

import grain
import numpy as np
import pytest
from etils import epath

from transformer import tasks
from transformer.data import DataConfig, make_datasets
from transformer.data.tokenizers import BOS_ID, CLS_ID, EOS_ID, NUM_SPECIAL

WORDS = "the of and to a in that is was he for it with as his on be at by i".split()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Tiny local data for every family, and a shared TFDS data dir."""
  root = tmp_path_factory.mktemp("data")
  rng = np.random.default_rng(0)
  sentence = lambda n: " ".join(rng.choice(WORDS, n))  # noqa: E731
  (root / "corpus.txt").write_text(
    "".join(sentence(rng.integers(3, 12)) + ".\n" for _ in range(600))
  )
  rows = [
    (f"{k} {sentence(rng.integers(2, 9))}", f"{k} {sentence(rng.integers(2, 12))}")
    for k in range(160)
  ]
  (root / "pairs.tsv").write_text("en\tes\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
  labelled = "".join(f"{a}\t{'odd' if k % 2 else 'even'}\n" for k, (a, _) in enumerate(rows[:120]))
  (root / "labelled.tsv").write_text("text\tlabel\n" + labelled)
  images = root / "idx"
  images.mkdir()
  for name, arr in (
    ("train-images-idx3-ubyte.gz", rng.integers(0, 256, (48, 6, 6), dtype=np.uint8)),
    ("train-labels-idx1-ubyte.gz", rng.integers(0, 10, 48).astype(np.uint8)),
    ("t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (10, 6, 6), dtype=np.uint8)),
    ("t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, 10).astype(np.uint8)),
  ):
    header = bytes([0, 0, 8, arr.ndim]) + np.array(arr.shape, ">u4").tobytes()
    (images / name).write_bytes(gzip.compress(header + arr.tobytes()))
  return {"root": root, "tfds": str(root / "tfds")}


def _spec(cfg):
  """The data spec of the task `cfg.kind` names."""
  return tasks.get(cfg.kind)().data_spec()


# The keys of each task's batches (docs/DATA.md).
BATCH_KEYS = {
  "lm": ("inputs", "targets", "weights", "segment_ids", "positions"),
  "mlm": ("inputs", "targets", "weights", "segment_ids", "positions"),
  "classification": ("inputs", "segment_ids", "positions", "label"),
  "seq2seq": (
    "inputs",
    "targets",
    "inputs_segment_ids",
    "targets_segment_ids",
    "inputs_positions",
    "targets_positions",
    "weights",
  ),
  "image": ("image", "label"),
}


def _config(data, name, **changes):
  root = data["root"]
  labelled, pairs, corpus = (
    str(root / "labelled.tsv"),
    str(root / "pairs.tsv"),
    str(root / "corpus.txt"),
  )
  idx = dict(kind="image", source="idx", path=str(root / "idx"), tokenizer="none")
  idx.update(eval_split="test", validation_fraction=0.0)  # the IDX files' own test split
  base = {
    "lm": dict(kind="lm", source="text", path=corpus),
    "lm_examples": dict(kind="lm", source="labelled", path=labelled, windows=False),
    "mlm": dict(kind="mlm", source="labelled", path=labelled),
    "mlm_windows": dict(kind="mlm", source="text", path=corpus),
    "classification": dict(kind="classification", source="labelled", path=labelled),
    "seq2seq": dict(
      kind="seq2seq", source="pairs", path=pairs, tokenizer="sentencepiece", vocab_size=60
    ),
    "seq2seq_padded": dict(kind="seq2seq", source="pairs", path=pairs, packing=False),
    "image": dict(**idx, crop_padding=1, horizontal_flip=True),
    "image_resized": dict(**idx, image_size=4),
  }[name]
  return DataConfig(data_dir=data["tfds"], **{**base, **changes})


def _make(
  data,
  name,
  tmp_path,
  seed=0,
  batch_size=4,
  seq_len=24,
  process_index=0,
  process_count=1,
  **changes,
):
  cfg = _config(data, name, **changes)
  return make_datasets(
    cfg, _spec(cfg), tmp_path, batch_size, seq_len, seed, process_index, process_count
  )


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  return len(a) == len(b) and all(
    set(x) == set(y) and all(np.array_equal(x[k], y[k]) for k in x)
    for x, y in zip(a, b, strict=True)
  )


FAMILIES = [
  "lm",
  "lm_examples",
  "mlm",
  "mlm_windows",
  "classification",
  "seq2seq",
  "seq2seq_padded",
  "image",
  "image_resized",
]


@pytest.mark.parametrize("name", FAMILIES)
def test_batches_have_exact_keys_dtypes_and_shapes(data, tmp_path, name):
  train, eval_factory, info = _make(data, name, tmp_path)
  kind = info.config.kind
  batches = _take(train, 3)
  for train_mode, batch in [(True, b) for b in batches] + [(False, b) for b in eval_factory()]:
    shapes = info.batch_shapes(train_mode)
    assert tuple(sorted(batch)) == tuple(sorted(BATCH_KEYS[kind])) == tuple(sorted(shapes))
    for key, value in batch.items():
      assert (value.shape, value.dtype) == shapes[key], key
  assert sum(1 for _ in eval_factory()) == info.eval_batches
  _check_semantics(kind, batches, info)


def _check_semantics(kind, batches, info):
  b = {k: np.concatenate([x[k] for x in batches]) for k in batches[0]}
  if kind == "lm":
    seg = b["segment_ids"]
    assert ((b["weights"] > 0) == (seg > 0)).all()
    same_segment = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    assert (
      b["targets"][:, :-1][same_segment] == b["inputs"][:, 1:][same_segment]
    ).all()  # next tokens
    starts = (b["positions"] == 0) & (seg > 0)
    if info.config.uses_windows:
      assert (seg == 1).all() and (b["positions"] == np.arange(info.seq_len)).all()
    else:
      assert (b["inputs"][starts] == BOS_ID).all() and (b["targets"] == EOS_ID).sum() > 0
  elif kind == "mlm":
    selected = b["weights"] > 0
    assert (b["targets"][selected] >= NUM_SPECIAL).all() and selected.any()
    assert (b["inputs"][~selected] == b["targets"][~selected]).all()
    assert (b["inputs"][(b["positions"] == 0) & (b["segment_ids"] > 0)] == CLS_ID).all()
  elif kind == "classification":
    assert (b["inputs"][:, 0] == CLS_ID).all() and set(b["label"].tolist()) <= {0, 1}
    assert ((b["inputs"] > 0) == (b["segment_ids"] > 0)).all()
  elif kind == "seq2seq":
    assert ((b["weights"] > 0) == (b["targets_segment_ids"] > 0)).all()
    for row, seg in zip(b["targets"], b["targets_segment_ids"], strict=True):
      for s in range(1, seg.max() + 1):
        assert row[seg == s][-1] == EOS_ID
  else:
    assert b["image"].dtype == np.float32 and abs(float(b["image"].mean())) < 0.5
    size = info.config.image_size or 6
    assert info.num_classes == 10 and info.image_shape == (size, size, 1)


@pytest.mark.parametrize("name", ["lm", "mlm", "seq2seq", "image"])
def test_same_seed_same_batches_different_seed_differs(data, tmp_path, name):
  a = _take(_make(data, name, tmp_path, seed=1)[0], 4)
  b = _take(_make(data, name, tmp_path, seed=1)[0], 4)
  c = _take(_make(data, name, tmp_path, seed=2)[0], 4)
  assert _same(a, b)
  assert not _same(a, c)


@pytest.mark.parametrize("name", ["lm", "lm_examples", "mlm", "seq2seq", "image"])
def test_resume_from_iterator_state_continues_exactly(data, tmp_path, name):
  train = _make(data, name, tmp_path, num_epochs=3)[0]
  _take(train, 5)
  state = train.get_state()
  expected = _take(train, 6)
  resumed = _make(data, name, tmp_path, num_epochs=3)[0]
  resumed.set_state(state)
  assert _same(_take(resumed, 6), expected)


def test_resume_through_grain_checkpoint_handler(data, tmp_path):
  train = _make(data, "mlm", tmp_path)[0]
  _take(train, 3)
  directory = epath.Path(tmp_path / "ckpt")
  directory.mkdir()
  grain.checkpoint.CheckpointHandler().save(directory, args=grain.checkpoint.CheckpointSave(train))
  expected = _take(train, 4)
  fresh = _make(data, "mlm", tmp_path)[0]
  grain.checkpoint.CheckpointHandler().restore(
    directory, args=grain.checkpoint.CheckpointRestore(fresh)
  )
  assert _same(_take(fresh, 4), expected)


def _texts(batch, tok):
  return [
    tok.decode(row[1:][seg[1:] > 0])
    for row, seg in zip(batch["inputs"], batch["segment_ids"], strict=True)
  ]


def test_host_shards_are_disjoint_and_cover_the_data(data, tmp_path):
  kw = dict(validation_fraction=0.0, test_fraction=0.0, eval_split="train", num_epochs=1)
  per_host_train, per_host_eval, eval_batches = [], [], []
  for host in range(2):
    train, eval_factory, info = _make(
      data, "classification", tmp_path, seq_len=80, process_index=host, process_count=2, **kw
    )
    assert info.batch_size == 2
    per_host_train.append([t for batch in train for t in _texts(batch, info.tokenizer)])
    evals = list(eval_factory())
    eval_batches.append(len(evals))
    per_host_eval.append(
      [
        t
        for batch in evals
        for t, label in zip(_texts(batch, info.tokenizer), batch["label"], strict=True)
        if label >= 0
      ]
    )
  everything = {
    line.split("\t")[0] for line in (data["root"] / "labelled.tsv").read_text().splitlines()[1:]
  }
  for rows in (per_host_train, per_host_eval):
    assert len(rows[0]) == len(rows[1]) == 60
    assert not set(rows[0]) & set(rows[1])
    assert set(rows[0]) | set(rows[1]) == everything
  assert eval_batches[0] == eval_batches[1] == info.eval_batches


def test_eval_is_padded_to_full_batches(data, tmp_path):
  _, eval_factory, info = _make(data, "classification", tmp_path, batch_size=16, seq_len=80)
  batches = list(eval_factory())
  labels = np.concatenate([b["label"] for b in batches])
  real = labels >= 0
  assert real.sum() == info.eval_examples and len(batches) == info.eval_batches
  assert len(labels) % 16 == 0 and (~real).sum() < 16 and (labels[~real] == -1).all()
  padded_segments = np.concatenate([b["segment_ids"] for b in batches])[~real]
  assert (padded_segments == 0).all()
  assert _same(batches, list(eval_factory()))  # a fresh, identical pass each time


def test_lm_eval_windows_predict_every_token_once(data, tmp_path):
  _, eval_factory, info = _make(data, "lm", tmp_path, seq_len=32)
  text = (data["root"] / "corpus.txt").read_text()
  # The validation split: from the first line start at or after 90% of the characters to 95%.
  start = text.index("\n", int(len(text) * 0.9) - 1) + 1
  end = text.index("\n", int(len(text) * 0.95) - 1) + 1
  stream = info.tokenizer.encode(text[start:end])
  targets = [
    t
    for b in eval_factory()
    for row, w in zip(b["targets"], b["weights"], strict=True)
    for t in row[w > 0]
  ]
  assert targets == stream[1:]


def test_stats_report_truncation_and_packing(data, tmp_path):
  info = _make(data, "seq2seq", tmp_path, seq_len=8)[2]
  over, seen = info.stats["train_overlong"]
  assert seen > 0 and 0 < over <= seen
  assert 0.3 < info.stats["packing_efficiency"] <= 1.0


def test_skip_policy_drops_overlong_training_examples(data, tmp_path):
  train, _, info = _make(data, "classification", tmp_path, seq_len=9, overlong="skip", num_epochs=1)
  kept = {t for batch in train for t in _texts(batch, info.tokenizer)}
  texts = [
    line.split("\t")[0] for line in (data["root"] / "labelled.tsv").read_text().splitlines()[1:]
  ]
  fitting = {t for t in texts if len(t) <= 8}  # [CLS] + 8 characters fill a row of 9
  assert 0 < len(fitting) < len(texts) and kept and kept <= fitting


def test_worker_processes_give_resumable_batches(data, tmp_path):
  train = _make(data, "seq2seq_padded", tmp_path, num_workers=1)[0]
  _take(train, 2)
  state = train.get_state()
  expected = _take(train, 3)
  train.close()
  resumed = _make(data, "seq2seq_padded", tmp_path, num_workers=1)[0]
  resumed.set_state(state)
  assert _same(_take(resumed, 3), expected)
  resumed.close()


def test_presets_point_at_shipped_data():
  from transformer.data import PRESETS

  for name, cfg in PRESETS.items():
    assert cfg.resolved_path().exists(), name


def test_shakespeare_preset_gives_nanogpt_batches(tmp_path):
  from transformer.data import PRESETS

  cfg = PRESETS["shakespeare_char"].replace(data_dir=str(tmp_path / "tfds"))
  train, eval_factory, info = make_datasets(cfg, _spec(cfg), tmp_path, 12, 64, 0, 0, 1)
  assert info.vocab_size == 7 + 65  # the 65 characters of tiny shakespeare
  batch = next(train)
  assert batch["inputs"].shape == (12, 64) and (batch["weights"] == 1).all()
  text = info.tokenizer.decode(batch["inputs"][0]) + info.tokenizer.decode(batch["targets"][0][-1:])
  assert info.tokenizer.decode(batch["targets"][0]) == text[1:]
  # Validation: the last 10% of the characters, from the next line start on (nanoGPT cuts
  # at exactly 90%: 111,540 characters; this split has 111,538), in windows of 64.
  assert info.eval_examples == -(-(111_538 - 1) // 64)
  targets = sum(int(b["weights"].sum()) for b in eval_factory())
  assert targets == 111_538 - 1
