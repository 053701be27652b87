"""Research tools: attention statistics, attention recording, plots, sweeps."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from session_env import PATIENCE_S

from transformer import tasks
from transformer.data.tokenizers import CharTokenizer
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.research import analysis, plots, sweep, sweep_points, sweep_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_lm_config.py")


def _size(path):
  assert os.path.getsize(path) > 0
  with Image.open(path) as image:
    return image.size


# ----------------------------------------------------------------------------------------
# Statistics against hand-computed values.

# Head 0: query 0 -> key 0 only; query 1 -> keys 0 and 1 equally.
# Head 1: query 0 -> key 1; query 1 -> key 0 (both one key at distance 1).
W = np.array([[[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [1.0, 0.0]]]])  # [1, 2, 2, 2]


def test_entropy_max_and_distance_by_hand():
  np.testing.assert_allclose(analysis.entropy(W), [math.log(2) / 2, 0.0], atol=1e-12)
  np.testing.assert_allclose(analysis.max_weight(W), [0.75, 1.0])
  # Head 0: (0 + 0.5 * |1 - 0|) / 2; head 1: (|0 - 1| + |1 - 0|) / 2.
  np.testing.assert_allclose(analysis.mean_distance(W), [0.25, 1.0])
  uniform3 = np.full((1, 1, 3, 3), 1 / 3)  # every query spread over 3 keys
  np.testing.assert_allclose(analysis.entropy(uniform3), [math.log(3)])
  np.testing.assert_allclose(analysis.max_weight(uniform3), [1 / 3])
  # Distances from queries 0, 1, 2: (0+1+2)/3, (1+0+1)/3, (2+1+0)/3.
  np.testing.assert_allclose(analysis.mean_distance(uniform3), [(1 + 2 / 3 + 1) / 3])


def test_statistics_average_only_valid_queries():
  only_first = np.array([[True, False]])  # query 1 is padding
  stats = analysis.head_statistics(W, only_first)
  np.testing.assert_allclose(stats["entropy"], [0.0, 0.0])
  np.testing.assert_allclose(stats["max_weight"], [1.0, 1.0])
  np.testing.assert_allclose(stats["distance"], [0.0, 1.0])
  with pytest.raises(ValueError, match="no query"):
    analysis.entropy(W, np.zeros((1, 2), bool))
  with pytest.raises(ValueError, match=r"\[B, N, T, S\]"):
    analysis.entropy(W[0])


# ----------------------------------------------------------------------------------------
# Recording the weights from every family.

BASE = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=16)


@pytest.mark.parametrize(
  "family, extra",
  [
    ("decoder", {"scan_layers": True, "remat_policy": "full", "attention_impl": "chunked"}),
    ("seq2seq", {}),
    ("vit", {"image_size": 8, "patch_size": 4, "num_channels": 1, "num_classes": 3}),
  ],
)
def test_record_attention_every_family(family, extra):
  model = build_model(ModelConfig(family=family, **BASE, **extra))
  tokens = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], jnp.int32)  # [2, 6]
  args = {
    "vit": (jnp.ones((2, 8, 8, 1)),),
    "seq2seq": (tokens, tokens[:, :5]),
  }.get(family, (tokens,))
  variables = model.init(jax.random.PRNGKey(0), *args)
  out, maps = analysis.record_attention(model, variables, *args)
  if family == "decoder":  # the recorded forward pass gives the model's usual output
    # Two programs (the recording attends in one block, the model in chunks): float32
    # rounding apart, about 1e-6 on outputs near 2 (seen on a 2-layer stack: 1.07e-6 on
    # one AVX-512 CPU), not bit for bit.
    np.testing.assert_allclose(out, model.apply(variables, *args), rtol=1e-5, atol=1e-5)
  names = list(maps)
  stack = "encoder" if family == "vit" else "decoder"
  if family == "seq2seq":
    assert names == [
      "encoder/layer_0/self_attention",
      "encoder/layer_1/self_attention",
      "decoder/layer_0/self_attention",
      "decoder/layer_0/cross_attention",
      "decoder/layer_1/self_attention",
      "decoder/layer_1/cross_attention",
    ]
    assert maps["decoder/layer_1/cross_attention"].shape == (2, 2, 5, 6)  # [B, N, T, S]
    np.testing.assert_allclose(maps["decoder/layer_0/cross_attention"][0, :, :4, 4:], 0.0)
  else:
    assert names == [f"{stack}/layer_0/self_attention", f"{stack}/layer_1/self_attention"]
  for w in maps.values():
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  if family == "decoder":  # causal: nothing above the diagonal
    w = maps["decoder/layer_1/self_attention"]
    np.testing.assert_allclose(w * np.triu(np.ones((6, 6)), 1), 0.0)
  if family == "seq2seq":  # the real queries of row 0 give its padding keys no weight
    np.testing.assert_allclose(maps["encoder/layer_0/self_attention"][0, :, :4, 4:], 0.0)

  rows = analysis.statistics_table(maps)
  assert len(rows) == len(maps) * 2
  assert [r["layer"] for r in rows[:4]] == [0, 0, 1, 1]
  assert set(rows[0]) == {"attention", "layer", "head", "entropy", "max_weight", "distance"}


def test_table_markdown_and_heatmaps(tmp_path):
  maps = {"decoder/layer_0/self_attention": W.astype(np.float32)}
  rows = analysis.statistics_table(maps)
  md = analysis.to_markdown(rows)
  assert md.splitlines()[0] == "| attention | layer | head | entropy | max_weight | distance |"
  assert "| decoder/layer_0/self_attention | 0 | 0 | 0.3466 | 0.75 | 0.25 |" in md
  paths = analysis.write_heatmaps(maps, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == ["decoder.layer_0.self_attention.png"]
  assert _size(paths[0]) == (600, 340)  # 2 heads of 300 px, + 40 px title


# ----------------------------------------------------------------------------------------
# Plots.


def test_plots_render_pngs_of_the_requested_size(tmp_path):
  pe = plots.posenc_heatmap(tmp_path / "pe.png", 32, 50, width_px=500, height_px=300)
  assert _size(pe) == (500, 300)
  runs = []
  for name, scale in (("a", 1.0), ("b", 2.0)):
    run = tmp_path / name
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
      for step in (1, 2, 3):
        f.write(json.dumps({"step": step, "split": "train", "loss": scale / step,
                            "learning_rate": 1e-3}) + "\n")  # fmt: skip
      f.write(json.dumps({"step": 3, "split": "eval", "loss": scale}) + "\n")
    runs.append(str(run))
  plots.main(["curves", *runs, "--out", str(tmp_path / "curves.png")])
  assert _size(tmp_path / "curves.png") == (1200, 450)
  plots.main(["posenc", "--d_model", "16", "--length", "20", "--out", str(tmp_path / "p.png")])
  assert _size(tmp_path / "p.png") == (900, 600)
  table = plots.confusion(np.array([[3, 1], [0, 4]]), ["x", "y"], tmp_path / "c.png")
  assert "| x | 3 | 1 |" in table and _size(tmp_path / "c.png") == (220, 220)
  with pytest.raises(ValueError, match="metrics.jsonl"):
    plots.curves([str(tmp_path / "missing")], tmp_path / "z.png")


# ----------------------------------------------------------------------------------------
# Sweeps (and analysis of a real run).


COMMON = ["--override", "num_train_steps=3", "--override", "eval_batches=1"]
COMMON += ["--override", "model.num_layers=1"]


def test_sweep_dry_run_prints_one_command_per_point(tmp_path, capsys):
  assert sweep.main([f"--config={TINY}", f"--workdir={tmp_path}", *COMMON, "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 2
  for line, lr in zip(lines, ("0.001", "0.003"), strict=True):
    assert f"--workdir={tmp_path}/schedule.learning_rate={lr}" in line
    assert f"--config.schedule.learning_rate={lr}" in line and "--config.num_train_steps=3" in line
  assert not os.listdir(tmp_path)  # ran nothing


@pytest.mark.slow
def test_sweep_runs_unfinished_points_resumes_and_tabulates(tmp_path):
  points = sweep.load_sweep(TINY)
  first, second = (os.path.join(tmp_path, sweep_points.point_name(p)) for p in points)
  # The first point "finished before" (as if the sweep had been killed after it).
  os.makedirs(first)
  with open(os.path.join(first, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 3, "split": "eval", "loss": 9.5}) + "\n")
  open(os.path.join(first, sweep_points.DONE), "w").close()

  cmd = [
    sys.executable,
    "-m",
    "transformer.research.sweep",
    f"--config={TINY}",
    f"--workdir={tmp_path}",
  ]
  result = subprocess.run(
    cmd + COMMON, cwd=REPO, capture_output=True, text=True, timeout=PATIENCE_S
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert "learning_rate=0.001: finished before, not run again" in result.stdout
  assert not os.path.exists(os.path.join(first, "train.log"))  # never launched
  assert os.path.isfile(os.path.join(second, sweep_points.DONE))
  assert sweep_results.final_eval(second)["step"] == 3
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["schedule.learning_rate"] for r in rows] == ["0.001", "0.003"]
  assert [r["status"] for r in rows] == ["done", "done"]
  assert float(rows[0]["eval_loss"]) == 9.5 and 0 < float(rows[1]["eval_loss"]) < 9
  table = (tmp_path / "results.md").read_text()
  assert "| schedule.learning_rate=0.003 | 0.003 | done | 3 |" in table
  assert _size(tmp_path / "sweep.png") == (800, 500)
  assert _size(tmp_path / "curves.png") == (1200, 450)

  # Attention analysis of the trained point (`eval.py --analyze`): the first eval rows.
  out = analysis.analyze(second, examples=2)
  assert out["step"] == 3 and len(out["rows"]) == 1 * 2  # layers x heads
  for row in out["rows"]:  # seq_len 16: at most 16 keys per query
    assert 0 <= row["entropy"] <= math.log(16) + 1e-6 and 1 / 16 - 1e-6 <= row["max_weight"] <= 1
    assert 0 <= row["distance"] <= 15
  with open(out["json"]) as f:
    assert json.load(f)["rows"] == out["rows"]
  assert os.path.isfile(os.path.join(second, "attention_step_3.md"))
  assert [os.path.basename(p) for p in out["heatmaps"]] == ["decoder.layer_0.self_attention.png"]


def test_text_input_batch():
  tok = CharTokenizer.train(["abcd"])
  batch = tasks.get("lm")().text_batch(tok, "abcab", max_len=4)
  np.testing.assert_array_equal(batch["inputs"], [tok.encode("abca")])
  np.testing.assert_array_equal(batch["positions"], [[0, 1, 2, 3]])
  assert batch["segment_ids"].tolist() == [[1, 1, 1, 1]]
  with pytest.raises(ValueError, match="token models"):
    tasks.get("image")().text_batch(tok, "ab", 4)
