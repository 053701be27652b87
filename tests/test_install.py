"""A non-editable `pip install .` works from outside the repository.

The project is installed (not editable) into a fresh virtual environment that sees this
environment's dependencies, so the install takes seconds; the package must then come from
that installation, not from the repository or the editable install. From another folder,
`transformer-train` trains the default config one step with the shipped config and data
found through the installation, and `transformer-eval` (and `python -m
transformer.eval_main`) evaluates the result.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from session_env import PATIENCE_S

REPO = Path(__file__).resolve().parents[1]
# Not part of a source tree to install (.gitignore).
_NOT_SOURCE = (".git", ".venv", "runs", "build", "tmp", "*.egg-info", "__pycache__", ".*_cache")
TINY = (
  "--config.num_train_steps=1", "--config.batch_size=8", "--config.seq_len=16",
  "--config.log_every=1", "--config.eval_every=0", "--config.eval_batches=1",
  "--config.checkpoint_every=1", "--config.evaluate.sample.max_new_tokens=4",
  "--config.schedule.warmup_steps=0",
  "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.num_layers=1",
  "--config.model.d_ff=64", "--config.model.max_len=16", "--config.data.eval_batch_size=8",
)  # fmt: skip


def _run(cmd, cwd, env, timeout=PATIENCE_S):
  out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
  return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(python, bin folder, env, an empty folder outside the repository) of the install."""
  root = tmp_path_factory.mktemp("install")
  source = root / "source"  # a copy, so that the build writes nothing into the repository
  shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = venv / "bin" / "python"
  purelib = Path(
    subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
      capture_output=True, text=True, check=True,
    ).stdout.strip()
  )  # fmt: skip
  # This environment's site-packages as plain path entries: its dependencies (and pip,
  # setuptools) are importable, but its .pth files, the editable install's among them, are
  # not processed, so `transformer` resolves to the new installation only.
  ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
  (purelib / "project_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  _run(
    [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
     "--no-index", "--ignore-installed", str(source)],
    cwd=root, env=env,
  )  # fmt: skip
  elsewhere = root / "elsewhere"
  elsewhere.mkdir()
  return python, venv / "bin", env, elsewhere


def test_the_package_comes_from_the_non_editable_install(installed):
  python, _, env, elsewhere = installed
  probe = (
    "import json, transformer, transformer.data.config as c;"
    "print(json.dumps([transformer.__file__, str(c.shipped_root()),"
    " str(c.DataConfig().resolved_path())]))"
  )
  out = _run([str(python), "-c", probe], cwd=elsewhere, env=env)
  package, shipped, data = (Path(p) for p in json.loads(out.stdout))
  venv = python.parent.parent
  assert package.is_relative_to(venv / "lib"), package  # not the repository, not editable
  assert not package.is_relative_to(REPO)
  assert shipped == (venv / "share" / "transformer").resolve()
  assert (shipped / "configs" / "lm_shakespeare.py").is_file()
  assert data == shipped / "data" / "tinyshakespeare.txt.gz" and data.is_file()
  assert (shipped / "data" / "fashion-mnist" / "train-labels-idx1-ubyte.gz").is_file()


@pytest.mark.slow
def test_installed_commands_train_and_evaluate_from_another_folder(installed):
  python, bin_dir, env, elsewhere = installed
  assert not (elsewhere / "configs").exists() and not (elsewhere / "data").exists()
  workdir = elsewhere / "run"
  train = [
    str(bin_dir / "transformer-train"), "--config", "configs/lm_shakespeare.py",
    f"--workdir={workdir.name}", *TINY,
  ]  # fmt: skip
  _run(train, cwd=elsewhere, env=env)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["num_train_steps"] == 1 and saved["model"]["d_model"] == 32
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in logged if r["split"] == "train"] == [1]
  assert any((workdir / "checkpoints").iterdir())

  out = _run([str(bin_dir / "transformer-eval"), f"--workdir={workdir}"], cwd=elsewhere, env=env)
  assert "step 1" in out.stdout and "loss" in out.stdout
  assert (workdir / "eval_step_1.json").is_file()
  module = [str(python), "-m", "transformer.eval_main", "--workdir=run", "--eval_batches=1"]
  assert "step 1" in _run(module, cwd=elsewhere, env=env).stdout


def test_config_paths_resolve_in_the_shipped_tree(tmp_path):
  """`--config configs/NAME.py[:arg]` names the shipped file unless one is in this folder."""
  (tmp_path / "mine.py").write_text("")
  probe = (
    "import json, sys; from transformer.cli import shipped_config_argv as f;"
    "print(json.dumps([f(a) for a in json.loads(sys.argv[1])]))"
  )
  cases = [
    ["t", "--config", "configs/vit.py:Ti/16", "--config.seed=1"],
    ["t", "--config=configs/lm_shakespeare.py", "--workdir=w"],
    ["t", "--config=mine.py"],  # a file here wins
    ["t", "--config=configs/no_such.py"],  # left for config_flags to report
    ["t", "--", "--config=configs/vit.py"],  # not a flag
  ]
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  out = _run([sys.executable, "-c", probe, json.dumps(cases)], cwd=tmp_path, env=env)
  configs = REPO / "configs"
  assert json.loads(out.stdout) == [
    ["t", "--config", f"{configs / 'vit.py'}:Ti/16", "--config.seed=1"],
    ["t", f"--config={configs / 'lm_shakespeare.py'}", "--workdir=w"],
    ["t", "--config=mine.py"],
    ["t", "--config=configs/no_such.py"],
    ["t", "--", "--config=configs/vit.py"],
  ]
