"""Packing and padding: segment ids, positions, whole examples, efficiency."""

import grain
import numpy as np
import pytest

from transformer.data import packing


def _examples(n, max_len, seed=0):
  rng = np.random.default_rng(seed)
  # Example k holds tokens 1000 * (k + 1) + position, so every token names its example.
  return [
    1000 * (k + 1) + np.arange(rng.integers(1, max_len + 1), dtype=np.int32) for k in range(n)
  ]


def _segments(tokens, segment_ids, positions):
  """The examples in a packed row, checking ids 1..k are contiguous and positions restart."""
  seg_values = segment_ids[segment_ids > 0]
  k = seg_values.max() if seg_values.size else 0
  n = int((segment_ids > 0).sum())
  assert (segment_ids[n:] == 0).all() and (tokens[n:] == 0).all() and (positions[n:] == 0).all()
  assert (np.diff(segment_ids[:n]) >= 0).all() and set(seg_values.tolist()) == set(range(1, k + 1))
  out = []
  for s in range(1, k + 1):
    where = np.flatnonzero(segment_ids == s)
    assert (np.diff(where) == 1).all()
    assert positions[where].tolist() == list(range(len(where)))
    out.append(tokens[where])
  return out


def test_pack_keeps_whole_examples_with_segments_and_positions():
  examples = _examples(300, 20)
  ds = grain.MapDataset.source([{"inputs": e} for e in examples]).to_iter_dataset()
  rows = list(packing.pack(ds, {"inputs": 32}, num_packing_bins=8))
  got = []
  for row in rows:
    assert row["inputs"].shape == (32,) and all(v.dtype == np.int32 for v in row.values())
    got += _segments(row["inputs"], row["inputs_segment_ids"], row["inputs_positions"])
  # Every example exactly once, never split across rows (each segment is a whole example).
  assert sorted(tuple(g) for g in got) == sorted(tuple(e) for e in examples)
  efficiency = packing.packing_efficiency(np.stack([r["inputs_segment_ids"] for r in rows]))
  assert efficiency == pytest.approx(sum(map(len, examples)) / (32 * len(rows)))
  assert efficiency > 0.8  # first fit over 8 bins of length-32 rows, examples of 1..20 tokens


def test_pack_seq2seq_jointly():
  rng = np.random.default_rng(1)
  pairs = [
    {"inputs": 100 * (k + 1) + np.arange(rng.integers(1, 9), dtype=np.int32),
     "targets": 100 * (k + 1) + np.arange(rng.integers(1, 13), dtype=np.int32)}
    for k in range(100)
  ]  # fmt: skip
  ds = grain.MapDataset.source(pairs).to_iter_dataset()
  rows = list(packing.pack(ds, {"inputs": 16, "targets": 24}, num_packing_bins=4))
  seen = 0
  for row in rows:
    ins = _segments(row["inputs"], row["inputs_segment_ids"], row["inputs_positions"])
    outs = _segments(row["targets"], row["targets_segment_ids"], row["targets_positions"])
    assert len(ins) == len(outs)
    for a, b in zip(
      ins, outs, strict=True
    ):  # segment k of the inputs pairs with segment k of the targets
      assert a[0] // 100 == b[0] // 100
    seen += len(ins)
  assert seen == len(pairs)


def test_pack_rejects_too_long_example():
  ds = grain.MapDataset.source([{"inputs": np.arange(1, 10, dtype=np.int32)}]).to_iter_dataset()
  with pytest.raises(ValueError, match="must be truncated"):
    list(packing.pack(ds, {"inputs": 8}, num_packing_bins=2))


def test_pad_example():
  ex = packing.pad_example({"inputs": np.array([5, 6, 7]), "label": 3}, {"inputs": 5})
  assert ex["inputs"].tolist() == [5, 6, 7, 0, 0]
  assert ex["inputs_segment_ids"].tolist() == [1, 1, 1, 0, 0]
  assert ex["inputs_positions"].tolist() == [0, 1, 2, 0, 0]
  assert ex["label"] == 3
  with pytest.raises(ValueError, match="does not fit"):
    packing.pad_example({"inputs": np.arange(6)}, {"inputs": 5})


def test_fit_length_policies():
  ids = np.arange(10)
  assert packing.fit_length(ids, 12, "error") is ids
  assert packing.fit_length(ids, 4, "truncate").tolist() == [0, 1, 2, 3]
  assert packing.fit_length(ids, 4, "skip") is None
  with pytest.raises(ValueError, match=r"data.tsv:7: 10 tokens exceed the sequence length 4"):
    packing.fit_length(ids, 4, "error", "data.tsv:7")
  with pytest.raises(ValueError, match="overlong policy"):
    packing.fit_length(ids, 4, "drop")


def test_packing_efficiency():
  assert packing.packing_efficiency(np.array([[1, 1, 2, 0], [1, 0, 0, 0]])) == 0.5
  assert packing.packing_efficiency(np.zeros((0,))) == 0.0
