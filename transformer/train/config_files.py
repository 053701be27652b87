"""Config files (`configs/*.py`, each a `get_config(arg=None)`) read by path: a config
file as a module (`load_module`), and a config file beside another (`beside`), so that a
config can start from a sibling's settings from any working directory:

  def get_config(arg=None):
    config = beside(__file__, "lm_shakespeare")  # configs/lm_shakespeare.py's config
    config.model.d_model = 64
    return config
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any


def load_module(path: str | Path, name: str = "_config") -> ModuleType:
  """The Python file at `path` as a module named `name` (not added to `sys.modules`)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def beside(file: str, name: str, arg: str | None = None) -> Any:
  """The config of `name`.py in the folder of `file` (a config's own `__file__`)."""
  module = load_module(Path(file).with_name(f"{name}.py"), name)
  return module.get_config() if arg is None else module.get_config(arg)
