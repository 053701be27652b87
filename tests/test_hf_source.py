"""`data.source='hf'`: Parquet, JSONL and Arrow files read as Hugging Face `datasets` does
(transformer/data/hf_source.py).

The tables are written here with pyarrow and `datasets` from the shipped corpora: bible
verses (en, es, testament) in all three formats, the sklearn digits as Parquet images
with class labels. Checked: the three formats give the same records; records and token
windows equal the local text source's on the same text; every task trains two steps from
them; two hosts read disjoint shards that cover a split; the training iterator resumes
exactly from its saved state; the token cache is read on a rerun; and every bad input is
one line naming the field or the file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_recipes import tiny

from transformer import tasks
from transformer.data import DataConfig, make_datasets, pipeline, sources
from transformer.train import loop as train_lib

REPO = Path(__file__).resolve().parents[1]
BIBLE = REPO / "data" / "bible_kjv_rv1909_en_es.tsv.gz"
EVERY = 14  # every 14th verse: 2,225 verses from both testaments


def _verses() -> list[dict]:
  with gzip.open(BIBLE, "rt", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t"))
  return [
    {
      "index": int(r["index"]),
      "testament": r["testament"],
      "en": r["en"],
      "es": r["es"],
      "words": len(r["en"].split()) / 10,
    }  # a float column
    for r in rows[::EVERY]
  ]


def _table(rows: list[dict]) -> pa.Table:
  return pa.Table.from_pylist(rows)


def _write_arrow(table: pa.Table, path: Path) -> None:
  """An Arrow IPC stream, as `datasets` writes its cache files."""
  with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table, max_chunksize=300)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict:
  """Folders of the same bible verses as Parquet (train in two files), JSONL and Arrow, and
  the digits as Parquet images; the rows of each split; a `datasets` cache folder."""
  root = tmp_path_factory.mktemp("tables")
  verses = _verses()
  splits = {"train": verses[: -len(verses) // 10], "validation": verses[-len(verses) // 10 :]}
  for kind in ("parquet", "jsonl", "arrow"):
    (root / kind).mkdir()
  half = len(splits["train"]) // 2
  for i, part in enumerate((splits["train"][:half], splits["train"][half:])):
    pq.write_table(_table(part), root / "parquet" / f"train-0000{i}-of-00002.parquet",
                   row_group_size=200)  # fmt: skip
  pq.write_table(
    _table(splits["validation"]), root / "parquet" / "validation-00000-of-00001.parquet"
  )
  for split, rows in splits.items():
    with open(root / "jsonl" / f"{split}.jsonl", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    _write_arrow(_table(rows), root / "arrow" / f"{split}-00000-of-00001.arrow")
  import datasets
  from sklearn.datasets import load_digits

  digits = load_digits()
  features = datasets.Features(
    {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
  )
  images = (digits.images * 255 / 16).astype(np.uint8)  # [N, 8, 8]
  (root / "digits").mkdir()
  for split, part in (("train", slice(0, 1500)), ("validation", slice(1500, None))):
    ds = datasets.Dataset.from_dict(
      {"image": list(images[part]), "label": digits.target[part].tolist()}, features=features
    )
    ds.to_parquet(str(root / "digits" / f"{split}-00000-of-00001.parquet"))
  return {"root": root, "splits": splits, "cache": str(root / "hf_cache"), "images": images}


def _hf(tables, folder="parquet", **fields) -> DataConfig:
  values = dict(source="hf", path=str(tables["root"] / folder), data_dir=tables["cache"])
  return DataConfig(**{**values, **fields})


def _spec(cfg: DataConfig, seq_len: int = 32):
  return tasks.create(cfg, seq_len).data_spec()


def _texts(records) -> list:
  return [r["en"] for r in records]


def test_parquet_jsonl_and_arrow_give_the_same_records(tables):
  expected = tables["splits"]
  labels = {"OT": 0, "NT": 1}
  for folder in ("parquet", "jsonl", "arrow"):
    cfg = _hf(tables, folder, kind="classification", text_column="en", label_column="testament",
              label_names=("OT", "NT"))  # fmt: skip
    splits = sources.open_splits(cfg, labelled=True)
    for got, rows in ((splits.train, expected["train"]), (splits.eval, expected["validation"])):
      assert len(got) == len(rows), folder
      assert [(r["en"], r["label"]) for r in got.__getitems__(range(len(got)))] == [
        (r["en"], labels[r["testament"]]) for r in rows
      ], folder
      assert got[5] == {"en": rows[5]["en"], "label": labels[rows[5]["testament"]]}
    assert splits.label_names == ("OT", "NT") and splits.text_keys == ("en",)
    assert splits.stats == {"train_bad_records": 0, "eval_bad_records": 0}


def test_nested_fields_are_read_by_their_dotted_names(tables, tmp_path):
  rows = tables["splits"]["train"][:40]
  path = tmp_path / "pairs.jsonl"
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"translation": {"en": r["en"], "es": r["es"]}}) + "\n" for r in rows)
  cfg = _hf(tables, path=str(path), kind="seq2seq", source_column="translation.en",
            target_column="translation.es", validation_fraction=0.1, test_fraction=0.0)  # fmt: skip
  splits = sources.open_splits(cfg, paired=True)
  assert splits.text_keys == ("translation.en", "translation.es")
  got = list(splits.train) + list(splits.eval)  # the first 36 records, then the last 4
  assert got == [{"translation.en": r["en"], "translation.es": r["es"]} for r in rows]


def test_a_file_or_glob_is_one_split_cut_like_local_text(tables):
  rows = tables["splits"]["train"]
  glob = str(tables["root"] / "parquet" / "train-*.parquet")
  cfg = _hf(tables, text_column="en", validation_fraction=0.1, test_fraction=0.05)
  n = len(rows)
  for path in (glob, str(tables["root"] / "jsonl" / "train.jsonl")):
    cut = {}
    for split in ("train", "validation", "test"):
      cut[split] = _texts(sources.open_splits(cfg.replace(path=path, eval_split=split)).eval)
    assert cut["train"] == _texts(rows[: int(n * 0.85)])
    assert cut["validation"] == _texts(rows[int(n * 0.85) : int(n * 0.95)])
    assert cut["test"] == _texts(rows[int(n * 0.95) :])
  sliced = sources.open_splits(cfg.replace(train_split="train[:10%]", eval_split="validation[5:9]"))
  assert _texts(sliced.train) == _texts(rows[: n // 10])
  assert _texts(sliced.eval) == _texts(tables["splits"]["validation"][5:9])


def test_records_and_windows_equal_the_text_source_and_the_stream_is_cached(tmp_path):
  """The shipped shakespeare's records written to Parquet read back to the same batches; as
  a token stream each record is a document ended with EOS, tokenized once."""
  text = DataConfig(validation_fraction=0.1, test_fraction=0.0, windows=False,
                    data_dir=str(tmp_path / "tfds"))  # fmt: skip
  local = sources.open_splits(text)
  folder = tmp_path / "shakespeare"
  folder.mkdir()
  for split, source in (("train", local.train), ("validation", local.eval)):
    chunks = [r["text"].decode() for r in source.__getitems__(range(len(source)))]
    pq.write_table(pa.table({"text": chunks}), folder / f"{split}.parquet", row_group_size=16)
  hf = text.replace(source="hf", path=str(folder), data_dir=str(tmp_path / "hf_cache"))
  runs = []
  for i, cfg in enumerate((text, hf)):
    train, evaluation, info = make_datasets(cfg, _spec(cfg), tmp_path / f"w{i}", 8, 32, 0, 0, 1)
    runs.append(([next(train) for _ in range(4)], list(evaluation()), info))
  (text_train, text_eval, text_info), (hf_train, hf_eval, hf_info) = runs
  assert (
    hf_info.vocab_size == text_info.vocab_size and hf_info.eval_batches == text_info.eval_batches
  )
  for ours, theirs in ((hf_train, text_train), (hf_eval, text_eval)):
    for a, b in zip(ours, theirs, strict=True):
      assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

  windows = hf.replace(windows=True)
  workdir = tmp_path / "windows"
  first = make_datasets(windows, _spec(windows), workdir, 8, 32, 0, 0, 1)
  tok = first[2].tokenizer
  splits = sources.open_splits(windows)
  eos = [tok.eos_id]
  expected = np.concatenate(
    [np.concatenate([tok.encode_array(r["text"]), eos]) for r in splits.train]
  )  # every speech chunk, then EOS
  starts = [int(s) for s in pipeline.windows(pipeline.window_starts(expected, 32, True, ""),
                                             pipeline.Batching(8, True, 0))[:8]]  # fmt: skip
  batch = next(first[0])
  assert np.array_equal(batch["inputs"], np.stack([expected[s : s + 32] for s in starts]))
  assert first[2].stats["train_token_cache"] == "written"
  (cached,) = [p for p in (workdir / "token_cache").iterdir() if len(np.load(p)) == len(expected)]
  assert np.array_equal(np.load(cached), expected)
  again = make_datasets(windows, _spec(windows), workdir, 8, 32, 0, 0, 1)
  assert again[2].stats["train_token_cache"] == again[2].stats["eval_token_cache"] == "read"
  rerun = next(again[0])
  assert all(np.array_equal(rerun[k], batch[k]) for k in batch), (rerun, batch)


HF_TASKS = {
  # recipe -> its data overrides for the tables (the recipe's own columns otherwise)
  "mlm_bible": {"path": "parquet"},
  "classify_testament": {"path": "jsonl", "eval_split": "validation"},
  "translate_en_es": {"path": "arrow", "eval_split": "validation"},
  "span_bible": {"path": "parquet", "text_column": "es"},  # one language's stream
  "prefix_lm_shakespeare": {"path": "parquet", "text_column": "en", "windows": True},
  "vit_digits": {"path": "digits", "eval_split": "validation"},
}


@pytest.mark.parametrize("stem", sorted(HF_TASKS))
def test_every_task_trains_two_steps_from_the_tables(stem, tables, tmp_path):
  """Each task's recipe, shrunk by tests/test_recipes.py `tiny()`, on the tables instead of
  its shipped data (the LM recipe on the shipped Parquet speeches is test_recipes' own)."""
  config = tiny(stem)
  overrides = dict(HF_TASKS[stem])
  overrides["path"] = str(tables["root"] / overrides["path"])
  config.data.update(source="hf", data_dir=tables["cache"], **overrides)
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert math.isfinite(metrics["loss"]), metrics
  assert os.path.isdir(tmp_path / "checkpoints" / "2")


def test_distill_reads_the_tables_with_a_teacher_trained_on_them(tables, tmp_path):
  teacher = str(tmp_path / "teacher")
  on_tables = dict(source="hf", path=str(tables["root"] / "parquet"), data_dir=tables["cache"],
                   text_column="en", windows=True)  # fmt: skip
  config = tiny("lm_shakespeare")
  config.data.update(**on_tables)
  train_lib.train_and_evaluate(config, teacher)
  student = tiny("distill_shakespeare")
  student.data.update(**on_tables)
  student.task.teacher = teacher
  metrics = train_lib.train_and_evaluate(student, str(tmp_path / "student"))
  assert math.isfinite(metrics["loss"]), metrics


def test_two_hosts_read_disjoint_shards_that_cover_the_split(tables):
  """The records each host's pipeline reads (`pipeline.examples`, as every record task's
  batches are built): disjoint, together the split; for training, one epoch each."""
  cfg = _hf(tables, text_column="en", max_bad_fraction=0.5)
  splits = sources.open_splits(cfg)
  for split in (splits.train, splits.eval):
    for train in (False, True):
      seen = []
      for host in range(2):
        loader = pipeline.Loader(host, 2, num_epochs=1)
        ds = pipeline.examples(split, pipeline.Batching(8, train, seed=1, loader=loader))
        seen.append([ds[i][0] for i in range(len(ds))])
      assert not set(seen[0]) & set(seen[1])
      assert sorted(seen[0] + seen[1]) == list(range(len(split)))


def test_the_training_iterator_resumes_exactly_from_its_state(tables, tmp_path):
  cfg = _hf(tables, kind="mlm", text_column="es", tokenizer="byte")
  it, _, _ = make_datasets(cfg, _spec(cfg, 64), tmp_path, 4, 64, 3, 0, 1)
  for _ in range(5):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed, _, _ = make_datasets(cfg, _spec(cfg, 64), tmp_path, 4, 64, 3, 0, 1)
  resumed.set_state(state)
  for a, b in zip(expected, [next(resumed) for _ in range(3)], strict=True):
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_records_are_shuffled_by_a_seeded_permutation():
  """grain's `shuffle` (`index_shuffle`: a Feistel-style bijection on the index, a new key
  per epoch), as `pipeline.ordered` applies it: each epoch a permutation, unlike another
  epoch's or seed's, with no constant stride between consecutive records."""
  n = 10_000
  order = pipeline.ordered(pipeline.records(list(range(n)), pipeline.Loader(0, 1)),
                           pipeline.Batching(8, True, seed=7))  # fmt: skip
  epoch0 = np.array([order[i][1] for i in range(n)])  # (index, record): the records
  epoch1 = np.array([order[n + i][1] for i in range(n)])
  assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n))
  assert all(order[n + i][0] == order[n + i][1] for i in range(100))  # errors name the record
  assert (epoch0 != epoch1).mean() > 0.99
  strides = np.diff(epoch0) % n
  assert np.unique(strides).size > n // 2  # a stride shuffle has one


# --- bad input: one line naming the field or the file ------------------------------------


def _raises(exc, pattern: str, cfg: DataConfig, **kwargs):
  with pytest.raises(exc) as info:
    sources.open_splits(cfg, **kwargs)
  message = str(info.value)
  assert "\n" not in message, message
  assert pattern in message, message
  return message


def test_a_missing_or_mistyped_column_names_the_field(tables):
  _raises(
    ValueError,
    "config.data.text_column='verse': no such column in",
    _hf(tables, text_column="verse"),
  )
  _raises(
    ValueError, "config.data.text_column='index': column of", _hf(tables, text_column="index")
  )
  _raises(ValueError, "holds int64, expected text (string)", _hf(tables, text_column="index"))
  bad_label = _hf(tables, kind="classification", text_column="en", label_column="words")
  _raises(ValueError, "config.data.label_column='words': column of", bad_label, labelled=True)
  _raises(ValueError, "holds float64, expected class labels", bad_label, labelled=True)
  images = _hf(tables, "digits", kind="image", image_column="picture", tokenizer="none")
  _raises(ValueError, "config.data.image_column='picture': no such column", images, images=True)


def test_an_unreadable_file_missing_path_or_split_is_one_line(tables, tmp_path):
  truncated = tmp_path / "truncated"
  truncated.mkdir()
  whole = (tables["root"] / "parquet" / "validation-00000-of-00001.parquet").read_bytes()
  (truncated / "train.parquet").write_bytes(whole[: len(whole) // 2])
  cfg = _hf(tables, text_column="en")
  _raises(ValueError, "unreadable or truncated file", cfg.replace(path=str(truncated)))
  _raises(FileNotFoundError, "no such file", cfg.replace(path=str(tmp_path / "none.parquet")))
  _raises(
    ValueError, "no split 'dev'; splits: ['train', 'validation']", cfg.replace(eval_split="dev")
  )
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  (mixed / "a.parquet").write_bytes(whole)
  (mixed / "b.jsonl").write_text('{"en": "x"}\n')
  _raises(ValueError, "found ['json', 'parquet']", cfg.replace(path=str(mixed)))


def test_a_hub_name_not_in_the_cache_names_the_fetch_command(tmp_path):
  cfg = DataConfig(source="hf", path="someone/no_such_dataset", hf_config="en",
                   data_dir=str(tmp_path / "cache"))  # fmt: skip
  message = _raises(
    FileNotFoundError, "data.path='someone/no_such_dataset': not in the datasets cache", cfg
  )
  assert "datasets.load_dataset('someone/no_such_dataset', 'en'" in message


def test_null_and_unknown_label_records_are_counted_skipped_or_stop_the_run(tmp_path):
  folder = tmp_path / "nulls"
  folder.mkdir()
  texts = [f"verse {i}" if i % 50 else None for i in range(1000)]  # 20 nulls
  labels = ["OT" if i % 3 else "NT" for i in range(1000)]
  labels[7] = "Apocrypha"  # not a label name
  pq.write_table(pa.table({"text": texts, "label": labels}), folder / "train.parquet")
  pq.write_table(
    pa.table({"text": ["a", None], "label": ["OT", "NT"]}), folder / "validation.parquet"
  )
  cfg = DataConfig(source="hf", path=str(folder), data_dir=str(tmp_path / "cache"),
                   kind="classification", label_names=("OT", "NT"))  # fmt: skip
  _raises(ValueError, "21 of 1000 records have a null in ['label', 'text'] or an unknown label, "
          "more than data.max_bad_fraction=0.001", cfg, labelled=True)  # fmt: skip
  splits = sources.open_splits(cfg.replace(max_bad_fraction=0.5), labelled=True)
  assert splits.stats == {"train_bad_records": 21, "eval_bad_records": 1}
  assert len(splits.train) == 979 and all(r["text"] for r in splits.train)
  assert {r["label"] for r in splits.train} == {0, 1}
  only_null = cfg.replace(max_bad_fraction=0.9, train_split="validation[1:]")
  _raises(ValueError, "[validation[1:]]: no records (1 bad of 1)", only_null, labelled=True)


def test_an_image_that_does_not_decode_names_its_row(tables, tmp_path):
  import PIL.Image

  pngs = []
  for image in tables["images"][:4]:
    buffer = io.BytesIO()
    PIL.Image.fromarray(image).save(buffer, format="PNG")
    pngs.append(buffer.getvalue())
  pngs[2] = pngs[2][:20]  # cut short
  pq.write_table(pa.table({"image": pngs, "label": [0, 1, 2, 3]}), tmp_path / "train.parquet")
  cfg = DataConfig(source="hf", path=str(tmp_path / "train.parquet"), kind="image",
                   tokenizer="none", validation_fraction=0.0, test_fraction=0.0,
                   eval_split="train", data_dir=str(tmp_path / "cache"))  # fmt: skip
  splits = sources.open_splits(cfg, images=True, labelled=True)
  assert splits.image_shape == (8, 8, 1) and np.array_equal(
    splits.train[1]["image"], tables["images"][1]
  )
  with pytest.raises(ValueError, match=r"train.parquet \[train\] \[row 2\]: does not decode: "):
    splits.train.__getitems__([0, 1, 2, 3])


def test_new_data_fields_are_checked():
  with pytest.raises(ValueError, match=r"max_bad_fraction must lie in \[0, 1\), got 1"):
    DataConfig(max_bad_fraction=1)
  with pytest.raises(ValueError, match="DataConfig.source must be one of"):
    DataConfig(source="huggingface")


def test_a_killed_run_on_parquet_resumes_bit_exactly(tmp_path):
  """train.py on the shipped Parquet speeches, as records packed into rows (the iterator
  state that must survive: the shuffled record order and the packer's): SIGKILL once the
  checkpoint of step 4 is committed, the same command again, and the final state equals an
  uninterrupted run's byte for byte."""
  import fault_harness as fh

  flags = (
    "--config.data.source=hf",
    "--config.data.path=data/shakespeare_speeches",
    f"--config.data.data_dir={tmp_path / 'hf_cache'}",
    "--config.data.windows=False",
    "--config.num_train_steps=40",
    "--config.checkpoint_every=4",
    "--config.log_every=1",
    "--config.eval_every=0",
  )
  env = fh.child_env()
  reference = str(tmp_path / "reference")
  run = fh.Run(fh.train_command(reference, *flags), env)
  assert run.wait() == 0, run.output()[-3000:]
  workdir = str(tmp_path / "killed")
  run = fh.Run(fh.train_command(workdir, *flags), env)
  run.wait_for(lambda line: line.startswith("step ") and 4 in fh.saved_steps(workdir))
  run.signal(signal.SIGKILL)
  run.wait()
  assert 4 in fh.saved_steps(workdir) and 40 not in fh.saved_steps(workdir)
  resumed = fh.Run(fh.train_command(workdir, *flags), env)
  assert resumed.wait() == 0, resumed.output()[-3000:]
  want, got = fh.final_state(reference), fh.final_state(workdir)
  assert want["step"] == got["step"] == 40
  assert fh.bit_equal(want["state"], got["state"]) == []


def test_the_shipped_parquet_speeches_are_what_the_script_writes(tmp_path):
  import importlib.util

  spec = importlib.util.spec_from_file_location("make_parquet", REPO / "scripts/make_parquet.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  assert script.write(tmp_path) == {"train": 6499, "validation": 723}
  for name in ("train-00000-of-00001.parquet", "validation-00000-of-00001.parquet"):
    assert (tmp_path / name).read_bytes() == (
      REPO / "data/shakespeare_speeches" / name
    ).read_bytes()


READ_SHARD = """
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from transformer import tasks
from transformer.data import DataConfig, make_datasets
cfg = DataConfig(source="hf", path=sys.argv[3], data_dir=sys.argv[4], kind="lm", tokenizer="byte",
                 windows=False, packing=False, num_epochs=1, validation_fraction=0.2,
                 test_fraction=0.0)
spec = tasks.create(cfg, 16).data_spec()
train, evaluation, info = make_datasets(cfg, spec, sys.argv[5], 4, 16, 0)  # jax's process
texts = {}
for split, batches in (("train", train), ("eval", evaluation())):
  rows = [row for b in batches for row, w in zip(b["inputs"], b["weights"]) if w.sum()]
  texts[split] = [info.tokenizer.decode([int(i) for i in row[1:] if i > 6]) for row in rows]
json.dump({"process": jax.process_index(), "count": jax.process_count(), **texts},
          open(sys.argv[6], "w"))
"""


def test_two_processes_read_disjoint_shards_that_cover_the_split(tmp_path):
  """Two `jax.distributed` processes on localhost each build the data of one run with
  `make_datasets`'s defaults (jax's process index and count) and read a whole epoch of
  training records (unpacked, one per row) and the evaluation split: disjoint, together
  every record (training drops each host's last partial batch)."""
  import subprocess
  import sys

  import fault_harness as fh
  from session_env import PATIENCE_S

  records = [f"record {i:03d}" for i in range(60)]
  pq.write_table(pa.table({"text": records}), tmp_path / "records.parquet")
  port = fh.free_port()

  def command(i: int) -> list[str]:
    paths = ("records.parquet", f"cache{i}", f"work{i}", f"read{i}.json")
    return [sys.executable, "-c", READ_SHARD, f"127.0.0.1:{port}", str(i),
            *(str(tmp_path / p) for p in paths)]  # fmt: skip

  out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  runs = [subprocess.Popen(command(i), env=fh.child_env(), **out) for i in range(2)]
  outputs = [run.communicate(timeout=PATIENCE_S)[0] for run in runs]
  assert [run.returncode for run in runs] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
  read = [json.loads((tmp_path / f"read{i}.json").read_text()) for i in range(2)]
  assert [(r["process"], r["count"]) for r in read] == [(0, 2), (1, 2)]
  for split, expected, dropped in (("train", records[:48], 8), ("eval", records[48:], 0)):
    a, b = read[0][split], read[1][split]
    assert not set(a) & set(b) and len(set(a)) == len(a) and len(set(b)) == len(b)
    assert set(a) | set(b) <= set(expected) and len(a) + len(b) >= len(expected) - dropped
  assert sorted(read[0]["eval"] + read[1]["eval"]) == records[48:]
