"""The default run's model and schedule on a Parquet dataset: tiny shakespeare as speeches.

`data.source='hf'` reads `data/shakespeare_speeches/` (`train-*.parquet`,
`validation-*.parquet`: 6,499 and 723 speeches, written from the shipped text by
scripts/make_parquet.py) as Hugging Face `datasets` does, memory-mapped. Each speech is a
document: tokenized on its own, ended with EOS, and the documents of a split joined into one
token stream that windows of 64 characters are drawn from (`data.windows`), as a web-text
corpus is read. The stream is tokenized once and kept in `WORKDIR/token_cache/`; a rerun
memory-maps it.

  python train.py --config configs/lm_shakespeare_parquet.py --workdir runs/lm_shakespeare_parquet

Any other Parquet, JSONL or Arrow folder, a glob of such files, or a Hub dataset in the
local `datasets` cache reads the same way: `--config.data.path=DIR_OR_NAME`
(`--config.data.text_column=...`; docs/DATA.md).

Validation loss over the whole validation split of the speeches: docs/RESULTS.md. It is
not comparable with lm_shakespeare's: the held-out text differs (the last 10% of the
speeches, each ended with EOS).
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")
lm_shakespeare = load_module(
  Path(__file__).with_name("lm_shakespeare.py"), "configs_lm_shakespeare"
)


def get_config(arg=None):
  del arg
  config = lm_shakespeare.get_config()
  d = config.data
  d.source = "hf"
  d.path = "data/shakespeare_speeches"  # its train and validation files name the splits
  d.text_column = "text"
  d.windows = True  # one token stream of EOS-separated speeches
  return config
