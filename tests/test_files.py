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
