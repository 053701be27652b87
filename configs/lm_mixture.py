"""The default run's model and schedule on a mixture: Shakespeare's plays and the English
verses of the King James Bible, 70 : 30.

`data.mixture` names each source (a data block of its own: `source`, `path`, columns,
splits) and its weight. Both are read as token streams of characters, with one character
vocabulary trained on both; every training batch comes from one source, the sources
interleaved so that any run of batches holds them 7 : 3 (data/mixture.py). The training
log counts each source's batches and epochs (`data/plays/epochs`, ...); every evaluation
scores both validation splits together (`loss`) and each alone (`plays/loss`,
`verses/loss`). A resume continues the mixture exactly.

  python train.py --config configs/lm_mixture.py --workdir runs/lm_mixture

Validation loss at the end, each split alone: docs/RESULTS.md.
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
  d.windows = True  # both sources as one token stream each
  plays = {"name": "plays", "source": "text", "path": common.SHAKESPEARE,
           "validation_fraction": 0.1, "test_fraction": 0.0}  # fmt: skip
  verses = {"name": "verses", "source": "labelled", "path": common.BIBLE_TSV,
            "text_column": "en", "label_column": "testament"}  # fmt: skip
  d.mixture = ((plays, 0.7), (verses, 0.3))
  config.evaluate.sample.max_new_tokens = 0  # two kinds of text: no one prompt fits both
  return config
