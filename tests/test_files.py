"""`files.write_atomic`: the one way the package replaces a file it writes whole."""

import os

import pytest

from transformer.data import files


def test_write_atomic_writes_text_and_bytes_creating_the_folder(tmp_path):
  path = tmp_path / "a" / "b" / "config.json"
  assert files.write_atomic(path, "héllo\n") == path
  assert path.read_bytes() == "héllo\n".encode()
  files.write_atomic(str(path), b"\x00\xff")  # replaces it; str paths too
  assert path.read_bytes() == b"\x00\xff"
  assert os.listdir(path.parent) == ["config.json"]  # no temporary file left behind


def test_write_atomic_failure_keeps_the_old_content_and_no_temporary(tmp_path):
  path = tmp_path / "taken"
  path.mkdir()
  (path / "inside").write_text("old\n")
  with pytest.raises(OSError):
    files.write_atomic(path, "new\n")  # the rename onto a non-empty folder fails
  assert (path / "inside").read_text() == "old\n"
  assert os.listdir(tmp_path) == ["taken"]  # the temporary file was removed


def test_staging_folder_removes_only_the_folders_of_ended_processes_of_its_remote(
  tmp_path, monkeypatch
):
  import subprocess
  import sys
  import tempfile

  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)  # fmt: skip
  dead = int(ended.stdout)
  mine = files.staging_folder("gs://b/run", "tensorboard")
  kind, digest, pid, _ = os.path.basename(mine).split("-", 3)
  assert (kind, pid) == ("tensorboard", str(os.getpid()))
  other = os.path.basename(files.staging_folder("gs://b/other", "tensorboard")).split("-")[1]
  with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as alive:
    try:
      killed = tmp_path / f"tensorboard-{digest}-{dead}-x"  # a killed run of the same remote
      running = tmp_path / f"tensorboard-{digest}-{alive.pid}-y"
      elsewhere = tmp_path / f"tensorboard-{other}-{dead}-z"  # a killed run of another
      for folder in (killed, running, elsewhere):
        folder.mkdir()
        (folder / "events").write_text("e")
      new = files.staging_folder("gs://b/run", "tensorboard")
      assert not killed.exists()
      assert running.exists() and elsewhere.exists() and os.path.isdir(mine)
      assert os.path.isdir(new) and new != mine
    finally:
      alive.kill()
