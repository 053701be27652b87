"""MLM masking proportions and determinism; image normalisation and augmentation."""

import itertools

import numpy as np
import pytest

from transformer.data import features, image_pipeline, images, masking, pipeline
from transformer.data.tokenizers import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID
from transformer.tasks.image import image_batches

VOCAB = 1000


def _rows(n_rows=800, length=128, seed=0):
  """Rows of [CLS] tokens [SEP] PAD..., about 100k ordinary tokens in all."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n_rows):
    n = int(rng.integers(100, length - 1))
    row = np.full(length, PAD_ID)
    row[0], row[1 : n - 1], row[n - 1] = CLS_ID, rng.integers(NUM_SPECIAL, VOCAB, n - 2), SEP_ID
    rows.append(row)
  return rows


def _mask_all(rows, seed, **kwargs):
  rng = np.random.default_rng(seed)
  return [masking.mask_tokens(r, rng, VOCAB, **kwargs) for r in rows]


def test_mlm_proportions_on_100k_tokens():
  rows = _rows()
  out = _mask_all(rows, seed=0)
  ids = np.concatenate(rows)
  inputs = np.concatenate([o[0] for o in out])
  weights = np.concatenate([o[1] for o in out])
  ordinary = ids >= NUM_SPECIAL
  assert ordinary.sum() > 85_000
  selected = weights > 0
  assert not selected[~ordinary].any()  # PAD, CLS, SEP are never predicted
  assert (inputs[~ordinary] == ids[~ordinary]).all()
  assert selected.sum() / ordinary.sum() == pytest.approx(0.15, abs=0.005)
  n = selected.sum()
  masked = (inputs == MASK_ID) & selected
  unchanged = (inputs == ids) & selected
  random = selected & ~masked & ~unchanged
  assert masked.sum() / n == pytest.approx(0.8, abs=0.02)
  # A random replacement equals the original 1 time in ~1000: "unchanged" absorbs those.
  assert unchanged.sum() / n == pytest.approx(0.1, abs=0.015)
  assert random.sum() / n == pytest.approx(0.1, abs=0.015)
  assert (inputs[random] >= NUM_SPECIAL).all() and (inputs[random] < VOCAB).all()
  assert (inputs[~selected] == ids[~selected]).all()
  assert all(o[0].dtype == np.int32 and o[1].dtype == np.float32 for o in out)


def test_mlm_is_deterministic_under_seed():
  rows = _rows(n_rows=20)
  a, b, c = _mask_all(rows, 3), _mask_all(rows, 3), _mask_all(rows, 4)
  assert all(
    np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
  )
  assert not all(np.array_equal(x[1], y[1]) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("rate", [0.15, 0.3, 0.5])
def test_no_row_selects_more_than_max_selected(rate):
  """`max_selected` bounds every row: the train step predicts that many positions per row."""
  rng = np.random.default_rng(1)
  for length in (3, 16, 37, 128):
    bound = masking.max_selected(rate, length)
    for _ in range(100):
      row = rng.integers(0, VOCAB, length)  # any mix of specials and ordinary tokens
      starts = rng.random(length) < 0.5
      for ws in (None, starts):
        _, weights = masking.mask_tokens(row, rng, VOCAB, mask_rate=rate, word_starts=ws)
        assert (weights > 0).sum() <= bound
    all_ordinary = rng.integers(NUM_SPECIAL, VOCAB, length)
    _, weights = masking.mask_tokens(all_ordinary, rng, VOCAB, mask_rate=rate)
    assert (weights > 0).sum() == bound  # the bound is reached, so it is the least one


def test_whole_word_masking_selects_whole_words():
  rng = np.random.default_rng(0)
  rows, starts = [], []
  for _ in range(300):
    lengths = rng.integers(1, 4, 40)  # 40 words of 1-3 tokens
    word_start = np.concatenate([[True] + [False] * (n - 1) for n in lengths])
    rows.append(rng.integers(NUM_SPECIAL, VOCAB, len(word_start)))
    starts.append(word_start)
  total = selected_total = 0
  for row, ws in zip(rows, starts, strict=True):
    _, weights = masking.mask_tokens(row, rng, VOCAB, word_starts=ws)
    word_id = np.cumsum(ws)
    for w in np.unique(word_id):  # a word is selected entirely or not at all
      assert len(set(weights[word_id == w].tolist())) == 1
    total += len(row)
    selected_total += weights.sum()
  assert selected_total / total == pytest.approx(0.15, abs=0.01)


def test_normalize_and_channel_stats():
  rng = np.random.default_rng(0)
  ims = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(20)]
  mean, std = images.channel_stats(ims)
  x = np.stack([images.normalize(im, mean, std) for im in ims])
  assert x.dtype == np.float32
  np.testing.assert_allclose(x.reshape(-1, 3).mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(x.reshape(-1, 3).std(0), 1, atol=1e-4)


def test_augment_is_seeded_and_shape_preserving():
  im = np.arange(6 * 5 * 1, dtype=np.uint8).reshape(6, 5, 1)
  outs = [
    images.augment(im, np.random.default_rng(s), crop_padding=2, flip=True) for s in range(20)
  ]
  assert all(o.shape == im.shape for o in outs)
  again = images.augment(im, np.random.default_rng(7), crop_padding=2, flip=True)
  np.testing.assert_array_equal(again, outs[7])
  assert len({o.tobytes() for o in outs}) > 5
  flipped = images.random_flip(im, np.random.default_rng(0))
  assert np.array_equal(flipped, im) or np.array_equal(flipped, im[:, ::-1])
  np.testing.assert_array_equal(images.augment(im, np.random.default_rng(0), 0, False), im)
  # The crop is a window of the zero-padded image.
  crop = images.random_crop(im, 2, np.random.default_rng(5))
  padded = np.pad(im, ((2, 2), (2, 2), (0, 0)))
  assert any(
    np.array_equal(crop, padded[t : t + 6, left : left + 5]) for t in range(5) for left in range(5)
  )


def test_augment_batch_crops_and_flips_each_image_on_its_own():
  batch = np.arange(40 * 6 * 5, dtype=np.int64).reshape(40, 6, 5, 1).astype(np.uint8)
  out = images.augment_batch(batch, np.random.default_rng(3), crop_padding=2, flip=True)
  again = images.augment_batch(batch, np.random.default_rng(3), crop_padding=2, flip=True)
  assert out.shape == batch.shape and out.dtype == np.uint8
  np.testing.assert_array_equal(out, again)
  windows = set()
  for b in range(40):  # image b is a window of its own padded image, mirrored or not
    padded = np.pad(batch[b], ((2, 2), (2, 2), (0, 0)))
    hits = [
      (t, left, m)
      for t in range(5)
      for left in range(5)
      for m in (False, True)
      if np.array_equal(
        out[b], (lambda w: w[:, ::-1] if m else w)(padded[t : t + 6, left : left + 5])
      )
    ]
    assert hits, b
    windows.add(hits[0])
  assert len(windows) > 10  # offsets and flips drawn per image
  np.testing.assert_array_equal(
    images.augment_batch(batch, np.random.default_rng(0), 0, False), batch
  )
  mirrored = images.augment_batch(batch, np.random.default_rng(0), 0, True)
  flipped = [np.array_equal(m, b[:, ::-1]) for m, b in zip(mirrored, batch, strict=True)]
  assert all(f or np.array_equal(m, b) for f, m, b in zip(flipped, mirrored, batch, strict=True))
  assert 5 < sum(flipped) < 35


def test_images_in_memory_give_the_batches_of_record_by_record_reads(monkeypatch):
  rng = np.random.default_rng(0)
  source = [{"image": rng.integers(0, 256, (6, 5), np.uint8), "label": i % 10} for i in range(103)]
  loader = pipeline.Loader(process_index=1, process_count=2)
  image, b = features.Image((0.3,), (0.35,)), pipeline.Batching(8, True, 3, loader)
  held = image_pipeline.in_memory_images(source, loader)
  assert held[0].shape == (51, 6, 5, 1) and list(held[1][:3]) == [1, 3, 5]  # this host's shard
  fast = list(itertools.islice(image_batches(source, image, b), 15))  # about 2 epochs
  monkeypatch.setattr(image_pipeline, "IN_MEMORY_IMAGE_BYTES", 0)  # record by record
  assert image_pipeline.in_memory_images(source, loader) is None
  slow = list(itertools.islice(image_batches(source, image, b), 15))
  for a, b in zip(fast, slow, strict=True):
    assert a["image"].dtype == b["image"].dtype == np.float32
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])
  mixed = source[:3] + [{"image": np.zeros((5, 6), np.uint8), "label": 0}]
  assert image_pipeline.in_memory_images(mixed, pipeline.Loader(0, 1)) is None  # sizes vary


def test_resize_center_crop():
  im = np.zeros((8, 4, 1), np.uint8)
  im[2:6] = 200  # the central 4 x 4 block
  np.testing.assert_array_equal(images.resize_center_crop(im, 4), np.full((4, 4, 1), 200, np.uint8))
  rgb = np.random.default_rng(0).integers(0, 256, (10, 20, 3), dtype=np.uint8)
  assert images.resize_center_crop(rgb, 5).shape == (5, 5, 3)
  assert images.resize_center_crop(rgb, 12).shape == (12, 12, 3)
