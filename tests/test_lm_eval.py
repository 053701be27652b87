"""The lm-evaluation-harness on our decoders (transformer/evaluators/harness_lm.py,
harness.py, transformer/lm_eval.py), offline.

Checked against independent computations: `loglikelihood` against float64 log-softmax of
one plain forward pass per request, at its own length; `loglikelihood_rolling` against the
summed loss of the lm task's own evaluation batches over the same token stream;
`generate_until` against the decoding it cuts. Then the harness end to end: a task defined
by a YAML file over a JSONL file written here (`HF_DATASETS_OFFLINE=1`, the test session's
setting) evaluated on a finished run, and the `harness` evaluator inside a training run.
"""

from __future__ import annotations

import json
import math
import shutil
import string

import numpy as np
import optax
import pytest
from conftest import tiny_model
from lm_eval.api.instance import Instance

from transformer import lm_eval as lm_eval_cli
from transformer import tasks
from transformer.data import pipeline
from transformer.data.features import Windows
from transformer.data.tokenizers import CharTokenizer
from transformer.evaluators import harness_lm
from transformer.train import loop as train_lib

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


@pytest.fixture(scope="module")
def lm():
  tokenizer = CharTokenizer.train([string.ascii_letters + string.punctuation + " \n"])
  # seed 4: its greedy continuation of "To be" runs 12 tokens without EOS ('eeeee(((((((')
  model, params = tiny_model("decoder", seed=4, vocab_size=tokenizer.vocab_size, max_len=16)
  return harness_lm.HarnessLM(model, params, tokenizer, batch_size=3)


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def _plain_logprobs(lm, ids: list[int]) -> np.ndarray:
  """float64 log p(ids[i + 1] | ids[: i + 1]) from one forward pass over `ids` alone."""
  logits = lm.model.apply({"params": lm.params}, np.asarray([ids[:-1]], np.int32))
  logits = np.asarray(logits[0], np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
  logp -= logits.max(-1, keepdims=True)
  return logp[np.arange(len(ids) - 1), ids[1:]], logits.argmax(-1) == np.asarray(ids[1:])


def test_loglikelihood_is_the_sum_of_plain_forward_log_probabilities(lm):
  tok = lm.tokenizer
  pairs = [("To be, or", " not to be"), ("", "Whether"), ("the question", ":"),
           ("x" * 30, "long contexts keep their end")]  # fmt: skip
  got = lm.loglikelihood(_requests("loglikelihood", pairs))
  for (context, continuation), (logp, greedy) in zip(pairs, got, strict=True):
    ids = (tok.encode(context) or [tok.bos_id]) + tok.encode(continuation)
    ids = ids[-(lm.window + 1) :]
    n = min(len(tok.encode(continuation)), len(ids) - 1)
    want, hits = _plain_logprobs(lm, ids)
    assert abs(logp - want[-n:].sum()) < 1e-5 * max(1.0, abs(logp)), (context, logp)
    assert greedy == bool(hits[-n:].all())
  # A continuation that is greedy decoding's own choice is reported as greedy.
  out = lm.generate_until(_requests("generate_until", [("To be", {"max_gen_toks": 3})]))[0]
  ((_, greedy),) = lm.loglikelihood(_requests("loglikelihood", [("To be", out)]))
  assert len(tok.encode(out)) == 3 and greedy


def test_loglikelihood_rolling_is_our_evaluations_summed_loss(lm):
  """The lm task's evaluation windows over [BOS] + the text: every window of `max_len`
  predicts its tokens; the summed cross-entropy is minus the rolling log-likelihood."""
  tok, t = lm.tokenizer, lm.window
  text = TEXT * 2
  (rolling,) = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(text,)]))
  stream = np.asarray([tok.bos_id, *tok.encode(text)], np.int32)
  starts = pipeline.window_starts(stream, t, False, "text")
  windows = Windows(stream, t)
  batch = {k: np.stack([windows(s)[k] for s in starts]) for k in windows(0)}
  task = tasks.get("lm")()
  logits, targets, weights = task.apply(lm.model, {"params": lm.params}, batch)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  total = float((losses * weights).sum())
  assert int(weights.sum()) == len(stream) - 1  # every token after BOS, once
  assert abs(rolling + total) < 1e-4 * abs(total), (rolling, total)


def test_generate_until_stops_at_the_stop_string(lm):
  whole = lm.generate_until(_requests("generate_until", [("To be", {"max_gen_toks": 12})]))[0]
  assert len(lm.tokenizer.encode(whole)) == 12
  stop = whole[4:6]
  cut = lm.generate_until(
    _requests("generate_until", [("To be", {"until": [stop, "never there"], "max_gen_toks": 12})])
  )[0]
  assert cut == whole[: whole.index(stop)]


def test_a_yaml_task_over_a_local_jsonl_runs_offline_on_a_finished_run(trained, tmp_path):
  """`python -m transformer.lm_eval` with `--include_path`: the harness's results file and
  the scores in metrics.jsonl (split lm_eval), with `HF_DATASETS_OFFLINE=1`."""
  docs = tmp_path / "docs.jsonl"
  rows = [{"context": "ROMEO:\nWhat", "choices": [" light", "qqqq"], "label": 0}] * 6
  docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "tasks").mkdir()
  (tmp_path / "tasks" / "tiny_choice.yaml").write_text(
    "task: tiny_choice\ndataset_path: json\n"
    f"dataset_kwargs:\n  data_files:\n    test: {docs}\n"
    "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
    "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\ntarget_delimiter: ''\n"
    "metric_list:\n  - metric: acc\n"
  )
  workdir = tmp_path / "run"
  shutil.copytree(trained["workdir"], workdir)
  tasks = "tiny_choice,shakespeare_continuation"
  flags = ["--limit", "5", "--include_path", str(tmp_path / "tasks")]
  results = lm_eval_cli.main(["--workdir", str(workdir), "--tasks", tasks, *flags])
  saved = json.loads((workdir / f"lm_eval_step_{trained['step']}.json").read_text())
  assert saved["results"] == results["results"]
  assert saved["results"]["tiny_choice"]["acc,none"] in (0.0, 1.0)
  assert 0.0 <= saved["results"]["shakespeare_continuation"]["acc,none"] <= 1.0
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  scores = [r for r in logged if r["split"] == "lm_eval"]
  assert scores and scores[-1]["tiny_choice/acc"] == saved["results"]["tiny_choice"]["acc,none"]


def test_the_harness_evaluator_runs_during_training(tmp_path):
  from fault_runs import tiny_lm_config

  config = tiny_lm_config(num_train_steps=4, eval_every=4, checkpoint_every=4)
  config.evaluators = ("sample", "harness")
  config.evaluate.harness.tasks = ("shakespeare_continuation",)
  config.evaluate.harness.every = 4
  config.evaluate.harness.limit = 4
  train_lib.train_and_evaluate(config, str(tmp_path))
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in logged if r["split"] == "eval" and r["step"] == 4]
  acc = evals[-1]["lm_eval/shakespeare_continuation/acc"]
  assert acc in (0.0, 0.25, 0.5, 0.75, 1.0) and math.isfinite(evals[-1]["loss"])
  results = json.loads((tmp_path / "lm_eval_step_4.json").read_text())
  assert results["results"]["shakespeare_continuation"]["acc,none"] == acc
  config.evaluate.harness.tasks = ("shakespeare_continuation", "no_such_task_anywhere")
  with pytest.raises(ValueError) as info:  # before anything is built
    train_lib.train_and_evaluate(config, str(tmp_path / "bad"))
  assert "\n" not in str(info.value)
  assert str(info.value).startswith(
    "config.evaluate.harness.tasks=('shakespeare_continuation', 'no_such"
  )
  assert "['no_such_task_anywhere']: unknown; shipped: ['shakespeare_continuation']" in str(
    info.value
  )


def test_the_shipped_task_is_what_the_script_writes(tmp_path):
  import importlib.util
  from pathlib import Path

  repo = Path(__file__).resolve().parents[1]
  spec = importlib.util.spec_from_file_location("make_cont", repo / "scripts/make_continuation.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  assert script.write(tmp_path) == {"validation": 50, "test": 508}
  for name in ("validation.jsonl", "test.jsonl"):
    shipped = (repo / "data/shakespeare_continuation" / name).read_bytes()
    assert (tmp_path / name).read_bytes() == shipped
  labels = [
    json.loads(line)["label"] for line in (tmp_path / "test.jsonl").read_text().splitlines()
  ]
  assert set(labels) == {0, 1, 2, 3}  # the true span is not always in one place


def test_a_hugging_face_checkpoint_scores_as_transformers_does(tmp_path):
  """`--model hf:DIR`: a tiny random GPT-2 written by scripts/make_tiny_hf.py, read as
  `init_from` reads it. Its `loglikelihood` equals the log-probabilities of the same
  directory loaded by transformers (PyTorch, float64 log-softmax), and the command writes
  the harness's results under `--output`."""
  import importlib.util
  from pathlib import Path

  import torch
  import transformers

  repo = Path(__file__).resolve().parents[1]
  spec = importlib.util.spec_from_file_location("make_tiny_hf", repo / "scripts/make_tiny_hf.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  folder = script.make("gpt2", tmp_path / "gpt2", texts=script.corpus(60))
  model, params, tokenizer, _ = lm_eval_cli._pretrained(f"hf:{folder}")
  lm = harness_lm.HarnessLM(model, params, tokenizer, batch_size=2)
  pairs = [("To be, or not", " to be"), ("ROMEO:", " What light")]
  got = lm.loglikelihood(_requests("loglikelihood", pairs))
  reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
  for (context, continuation), (logp, _) in zip(pairs, got, strict=True):
    ids, n = (
      tokenizer.encode(context) + tokenizer.encode(continuation),
      len(tokenizer.encode(continuation)),
    )
    with torch.no_grad():
      logits = reference(torch.tensor([ids])).logits[0].double()
    want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])][-n:]
    assert abs(logp - float(want.sum())) < 1e-4, (context, logp, float(want.sum()))
  out = tmp_path / "results"
  results = lm_eval_cli.main(["--model", f"hf:{folder}", "--output", str(out), "--tasks",
                              "shakespeare_continuation", "--limit", "4"])  # fmt: skip
  assert (out / "lm_eval_step_0.json").exists()
  assert 0.0 <= results["results"]["shakespeare_continuation"]["acc,none"] <= 1.0
