"""Input throughput of `data.source='hf'` (Parquet) next to the local text source, and what
the token cache saves at start-up. One process, no model: only the data pipeline.

  python benchmarks/input_pipeline.py                 # 3 rounds, 200 batches of 24 x 64
  python benchmarks/input_pipeline.py --rounds 5 --batches 500

Both sources hold the same text, tiny shakespeare: `text` reads data/tinyshakespeare.txt.gz
(TFDS array_record chunks of about 1,000 characters), `hf` the shipped Parquet speeches
(data/shakespeare_speeches, 6,499 training records). Per round, alternating the sources:

- reads: every training record read once in bulk (`__getitems__`, 1,024 at a time): records/s;
- records: the lm task's training batches from records packed into rows (`windows=False`),
  `--batches` of them after the first: records/s (segments) and tokens/s (non-padding);
- windows: the same from the token stream (`windows=True`);
- start-up of a `windows` run: `make_datasets` with the tokenizer trained but no token cache
  (the stream tokenized and written; the text source always tokenizes) and again (the
  stream memory-mapped from the cache).

`--tokenizer sentencepiece` (2,048 pieces) shows the cache where tokenizing costs more.

Prints the CPU flags and a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from transformer import tasks  # noqa: E402
from transformer.data import DataConfig, features, make_datasets, sources  # noqa: E402
from transformer.train.machine import cpu_isa  # noqa: E402

TEXT = DataConfig(validation_fraction=0.1, test_fraction=0.0)
HF = TEXT.replace(source="hf", path="data/shakespeare_speeches")


def reads(cfg: DataConfig) -> float:
  """Records/s of one bulk pass over the training split."""
  split = sources.open_splits(cfg).train
  start = time.perf_counter()
  n = sum(1 for _ in features.read_records(split, range(len(split))))
  return n / (time.perf_counter() - start)


def batches(cfg: DataConfig, workdir: str, count: int, rows: int, seq_len: int) -> tuple:
  """(records/s, tokens/s) of `count` training batches after the first."""
  spec = tasks.create(cfg, seq_len).data_spec()
  it, _, _ = make_datasets(cfg, spec, workdir, rows, seq_len, 0, 0, 1)
  next(it)
  segments = tokens = 0
  start = time.perf_counter()
  for _ in range(count):
    b = next(it)
    ids = b["segment_ids"]
    tokens += int((ids > 0).sum())
    segments += sum(len(np.unique(row[row > 0])) for row in ids)
  seconds = time.perf_counter() - start
  it.close()
  return segments / seconds, tokens / seconds


def start_up(cfg: DataConfig, workdir: str, seq_len: int) -> tuple[float, float]:
  """Seconds of `make_datasets` without, then with the token cache (tokenizer trained)."""
  spec = tasks.create(cfg, seq_len).data_spec()
  seconds = []
  for _ in range(2):
    start = time.perf_counter()
    it, _, _ = make_datasets(cfg, spec, workdir, 24, seq_len, 0, 0, 1)
    seconds.append(time.perf_counter() - start)
    it.close()
  shutil.rmtree(os.path.join(workdir, "token_cache"))
  start = time.perf_counter()
  it, _, _ = make_datasets(cfg, spec, workdir, 24, seq_len, 0, 0, 1)
  cold = time.perf_counter() - start
  it.close()
  return cold, seconds[1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--rows", type=int, default=24)
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--tokenizer", default="char", choices=("char", "sentencepiece"))
  args = parser.parse_args()
  print(f"# input pipeline, {args.tokenizer} tokenizer, {os.cpu_count()} cores; {cpu_isa()}")
  results: dict[str, list] = {}
  with tempfile.TemporaryDirectory() as tmp:
    data = dict(data_dir=os.path.join(tmp, "prepared"), tokenizer=args.tokenizer, vocab_size=2048)
    for r in range(args.rounds):
      for name, base in (("text", TEXT.replace(**data)), ("hf", HF.replace(**data))):
        work = os.path.join(tmp, f"{name}{r}")
        row = results.setdefault(name, [])
        records = batches(base.replace(windows=False), work, args.batches, args.rows, args.seq_len)
        windows = batches(base.replace(windows=True), work, args.batches, args.rows, args.seq_len)
        os.makedirs(os.path.join(work + "-startup", "token_cache"), exist_ok=True)
        cold, warm = start_up(base.replace(windows=True), work + "-startup", args.seq_len)
        row.append((reads(base), *records, *windows, cold, warm))
  print(
    "\n| source | reads, records/s | records: records/s | tokens/s | windows: tokens/s "
    "| start-up, tokenized (s) | cached (s) |\n| --- | --- | --- | --- | --- | --- | --- |"
  )
  for name, rounds in results.items():
    m = [statistics.median(column) for column in zip(*rounds, strict=True)]
    rates = " | ".join(f"{v:,.0f}" for v in (m[0], m[1], m[2], m[4]))
    print(f"| {name} | {rates} | {m[5]:.2f} | {m[6]:.2f} |")


if __name__ == "__main__":
  main()
