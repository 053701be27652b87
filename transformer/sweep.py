"""`python -m transformer.sweep`: hyperparameter sweeps on Ray Tune.

  python -m transformer.sweep --config configs/X.py[:arg] --workdir DIR [flags]

The same command as `python -m transformer.research.sweep` (the implementation, with the
flags); docs/RESEARCH.md#sweeps. Needs the `sweep` extra: pip install '.[sweep]'.
"""

import sys

from transformer.research.sweep import main

if __name__ == "__main__":
  sys.exit(main())
