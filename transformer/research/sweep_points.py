"""What the two sides of a sweep share (`sweep.py` plans and reports, `tune_sweep.py` runs
on Ray Tune): a point's folder name, its training command and the marker of a finished run.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from typing import Any

from etils import epath

DONE = "done"  # in DIR/<point>: the training run finished
EXPERIMENT = "tune"  # DIR/tune: the Tune experiment (trial states, searcher, results)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+-]")
_MAX_NAME = 150  # longer point names are cut and end in a hash (file names stay short)


def point_name(overrides: Mapping[str, Any]) -> str:
  """A directory name for one point: 'schedule.learning_rate=0.001,model.num_layers=4'."""
  if not overrides:
    return "default"
  name = _UNSAFE.sub("_", ",".join(f"{k}={_value(v)}" for k, v in overrides.items()))
  if len(name) > _MAX_NAME:
    name = name[: _MAX_NAME - 13] + "-" + hashlib.sha1(name.encode()).hexdigest()[:12]
  return name


def _value(v: Any) -> str:
  return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def train_command(
  config: str, workdir: str, overrides: Mapping[str, Any], python: str = sys.executable
) -> list[str]:
  """The training command line of one point (`python -m transformer.train_main ...`)."""
  cmd = [python, "-m", "transformer.train_main", f"--config={config}", f"--workdir={workdir}"]
  return cmd + [f"--config.{k}={_value(v)}" for k, v in overrides.items()]


def is_done(point_dir: str) -> bool:
  return epath.Path(point_dir, DONE).is_file()
