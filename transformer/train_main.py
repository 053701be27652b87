"""`transformer-train` (`python -m transformer.train_main`): train.py as an installed command.

  transformer-train --config configs/NAME.py[:arg] --workdir DIR [--config.a.b=v ...]

The same flags and behaviour as `python train.py`: the command is `main` at the end of
`transformer/train/loop.py`. A `--config` path that is not a file here names a shipped
config (`configs/...` of the checkout, or of `pip install .`).
"""

from absl import app

from transformer import cli
from transformer.train import loop


def run() -> None:
  """The console entry point."""
  loop.define_flags()
  app.run(loop.main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
