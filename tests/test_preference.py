"""The `preference` task (transformer/tasks/preference.py): each loss against TRL's own code
(DPOTrainer on a tiny GPT-2 our importer loads, CPOTrainer's SimPO, ORPOTrainer's odds
ratio), the completions it scores, the frozen reference (loaded, checkpointed, never
trained; LoRA's base weights with no copy), kill and resume bit-exact, and bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import types
from pathlib import Path

import fault_harness as fh
import jax
import numpy as np
import pytest
import tiny_preference_config
import torch
from test_recipes import make_tiny_hf, tiny

from transformer.data import sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import CharTokenizer
from transformer.nn.models import build_model
from transformer.tasks import preference as pref
from transformer.tasks import preference_losses as pl
from transformer.train import experiment, setup
from transformer.train import loop as train_lib

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
CONFIG = os.path.join(os.path.dirname(__file__), "tiny_preference_config.py")


def _arith_pairs(count: int, start: int = 0) -> list[dict]:
  """Conversational pairs 'a+b=': the sum chosen, the sum plus one rejected."""
  rows = []
  for i in range(start, start + count):
    a, b = (7 * i) % 100, (13 * i + 5) % 100
    rows.append({
      "prompt": [{"role": "user", "content": f"{a}+{b}="}],
      "chosen": [{"role": "assistant", "content": str(a + b)}],
      "rejected": [{"role": "assistant", "content": str(a + b + 1)}],
    })  # fmt: skip
  return rows


def _write_pairs(root: Path, train: list[dict], test: list[dict]) -> Path:
  root.mkdir(parents=True, exist_ok=True)
  for split, rows in (("train", train), ("test", test)):
    (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return root


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  """A few SFT updates on data/arith (the policy and reference of the runs below) and a
  folder of arithmetic pairs."""
  root = tmp_path_factory.mktemp("preference")
  train_lib.train_and_evaluate(tiny_preference_config.get_config("sft"), str(root / "sft"))
  pairs = _write_pairs(root / "pairs", _arith_pairs(40), _arith_pairs(8, start=40))
  return str(root / "sft"), str(pairs)


def _dpo_config(sft_run, **task):
  sft, pairs = sft_run
  config = tiny_preference_config.get_config()
  config.model.dropout_rate = 0.0
  config.init_from = sft
  config.data.tokenizer_from = sft
  config.data.path = pairs
  config.task.update(task)
  return config


# The losses against TRL's ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
  """Two tiny GPT-2 directories: the policy and the reference."""
  root, script = tmp_path_factory.mktemp("gpt2"), make_tiny_hf()
  texts = script.corpus(60)
  return tuple(script.make("gpt2", root / name, seed=s, texts=texts) for s, name in
               ((0, "policy"), (1, "reference")))  # fmt: skip


# Three pairs of [BOS] prompt completion [EOS] rows of different lengths (0 = padding).
IDS = [[11, 12, 13, 21, 22, 23, 0], [11, 14, 31, 32, 0, 0, 0], [15, 16, 17, 18, 41, 0, 0]]
REJ = [[11, 12, 13, 24, 0, 0, 0], [11, 14, 33, 34, 35, 36, 0], [15, 16, 17, 18, 42, 43, 0]]
PROMPT_LENGTHS = [3, 2, 4]


def _trl_inputs() -> dict[str, torch.Tensor]:
  """TRL's collated batch: the chosen rows, then the rejected ones."""
  ids = torch.tensor(IDS + REJ)
  prompt = torch.tensor(PROMPT_LENGTHS * 2)[:, None]
  completion = (torch.arange(ids.shape[1])[None] >= prompt) & (ids > 0)
  mask = (ids > 0).long()
  return {"input_ids": ids, "attention_mask": mask, "completion_mask": completion.long()}


def _our_batch(inputs) -> dict[str, np.ndarray]:
  """The same pairs as this task's batch."""
  ids, completion = inputs["input_ids"].numpy(), inputs["completion_mask"].numpy()
  batch, n = {}, len(IDS)
  for side, rows in (("chosen", slice(0, n)), ("rejected", slice(n, 2 * n))):
    x, c = ids[rows], completion[rows]
    batch[f"{side}_inputs"], batch[f"{side}_targets"] = x[:, :-1], x[:, 1:]
    batch[f"{side}_weights"] = c[:, 1:].astype(np.float32)
    batch[f"{side}_segment_ids"] = (x[:, :-1] > 0).astype(np.int32)
    batch[f"{side}_positions"] = np.broadcast_to(np.arange(x.shape[1] - 1), x[:, :-1].shape)
  return batch


TRL_DPO = {  # our options -> TRL's DPOConfig
  "sigmoid": dict(loss_type="sigmoid", beta=0.3),
  "robust": dict(loss_type="robust", beta=0.2, label_smoothing=0.1),
  "hinge": dict(loss_type="hinge", beta=0.5),
  "ipo": dict(loss_type="ipo", beta=0.4),
  "sigmoid+sft": dict(loss_type="sigmoid", beta=0.3, sft_weight=0.7),
}


@pytest.mark.parametrize("loss_type", sorted(TRL_DPO))
def test_the_dpo_family_equals_trls_dpo_trainer(loss_type, gpt2_pair, tmp_path):
  """TRL's DPOTrainer on the tiny GPT-2 policy and reference: our loss on its
  log-probabilities (float64) equals its loss to 1e-6; our task on the same checkpoints
  imported (float32) gives its loss, rewards and log-probabilities."""
  import datasets
  import transformers
  from trl import DPOConfig, DPOTrainer

  policy_dir, reference_dir = gpt2_pair
  options = TRL_DPO[loss_type]
  tok = transformers.AutoTokenizer.from_pretrained(policy_dir)
  models = [transformers.AutoModelForCausalLM.from_pretrained(d) for d in gpt2_pair]
  data = datasets.Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
  weight = options.get("sft_weight", 0.0)
  trl_options = {k: v for k, v in options.items() if k != "sft_weight"}
  trl_options["loss_type"] = [options["loss_type"], *(["sft"] if weight else [])]
  trl_options["loss_weights"] = [1.0, *([weight] if weight else [])]
  args = DPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                   **trl_options)  # fmt: skip
  trainer = DPOTrainer(model=models[0], ref_model=models[1], args=args, train_dataset=data,
                       processing_class=tok)  # fmt: skip
  trainer.model.eval()
  inputs = _trl_inputs()
  with torch.no_grad():
    want = float(trainer._compute_loss(trainer.model, inputs, False))
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
    kwargs = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                  labels=labels, use_cache=False, fused_lm_head=True)  # fmt: skip
    logps = [m(**kwargs).log_probs.sum(dim=1).double().numpy() for m in (trainer.model,
             trainer.ref_model)]  # fmt: skip
  n = len(IDS)
  counts = inputs["completion_mask"][:, 1:].sum(dim=1).double().numpy()
  policy, reference = (pl.Logps(x[:n], x[n:], counts[:n], counts[n:]) for x in logps)
  with jax.enable_x64(True):
    losses, *_ = pl.pair_losses(
      options["loss_type"],
      options["beta"],
      options.get("label_smoothing", 0.0),
      0.0,
      policy,
      reference,
    )
    assert losses.dtype == np.float64
    nll = -np.sum(policy.chosen) / np.sum(policy.chosen_tokens)  # TRL's 'sft' term
    np.testing.assert_allclose(np.mean(losses) + weight * nll, want, rtol=1e-6, atol=1e-7)

  task = pref.Preference(options=pref.PreferenceOptions(**options, reference=f"hf:{reference_dir}"))
  ours, params = setup.load_trained(f"hf:{policy_dir}")
  task, frozen = task.frozen(ours, setup.load_trained)
  model = build_model(ours)
  total, pairs, sums = task.loss(model.bind({"params": params}), _our_batch(inputs), True, frozen)
  assert float(pairs) == n
  np.testing.assert_allclose(float(total) / n, want, rtol=1e-4, atol=1e-6)
  for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
               "logps/chosen", "logps/rejected"):  # fmt: skip
    np.testing.assert_allclose(float(sums[name]) / n, trl_metrics[name], rtol=1e-4, atol=1e-5)


def _logps(rng, n=5) -> pl.Logps:
  counts = rng.integers(1, 9, size=n).astype(np.float64)
  return pl.Logps(-rng.uniform(0.1, 3, n) * counts, -rng.uniform(0.1, 3, n) * counts, counts,
                  rng.integers(1, 9, size=n).astype(np.float64))  # fmt: skip


def _trainer_self(**fields):
  """The attributes TRL's loss methods read of their trainer."""
  accelerator = types.SimpleNamespace(device=torch.device("cpu"))
  return types.SimpleNamespace(accelerator=accelerator, **fields)


def test_simpo_and_conservative_dpo_equal_trls_cpo_loss():
  from trl.experimental.cpo import CPOTrainer

  rng = np.random.default_rng(0)
  policy, reference = _logps(rng), _logps(rng)
  means = [torch.tensor(np.asarray(x)) for x in policy.means()]
  cpo = _trainer_self(alpha=0.0, loss_type="simpo", beta=2.0, simpo_gamma=0.7, label_smoothing=0.1)
  want, chosen, rejected = CPOTrainer.cpo_loss(cpo, *means)
  # cDPO: the smoothed sigmoid of CPO on the DPO log-ratios
  ratios = [torch.tensor(policy.chosen - reference.chosen),
            torch.tensor(policy.rejected - reference.rejected)]  # fmt: skip
  cdpo = _trainer_self(alpha=0.0, loss_type="sigmoid", beta=0.3, label_smoothing=0.2)
  want_cdpo = CPOTrainer.cpo_loss(cdpo, *ratios)[0]
  with jax.enable_x64(True):
    losses, c, r, _ = pl.pair_losses("simpo", 2.0, 0.1, 0.7, policy, None)
    np.testing.assert_allclose(losses, want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(c, chosen.numpy(), rtol=1e-6)
    np.testing.assert_allclose(r, rejected.numpy(), rtol=1e-6)
    losses = pl.pair_losses("sigmoid", 0.3, 0.2, 0.0, policy, reference)[0]
    np.testing.assert_allclose(losses, want_cdpo.numpy(), rtol=1e-6)


def test_orpo_equals_trls_odds_ratio_loss():
  from trl.experimental.orpo import ORPOTrainer

  rng = np.random.default_rng(1)
  policy = _logps(rng)
  means = [torch.tensor(np.asarray(x)) for x in policy.means()]
  orpo = _trainer_self(beta=0.25)
  ratio_losses, chosen, rejected, ratio, log_odds = ORPOTrainer.odds_ratio_loss(orpo, *means)
  with jax.enable_x64(True):
    losses, c, r, extra = pl.pair_losses("orpo", 0.25, 0.0, 0.0, policy, None)
    nll = -np.asarray(policy.means()[0])  # the chosen completion's mean NLL (ORPO's L_SFT)
    np.testing.assert_allclose(losses, nll - ratio_losses.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.mean(extra["log_odds_ratio"]), float(ratio), rtol=1e-6)
    np.testing.assert_allclose(np.mean(extra["log_odds_chosen"]), float(log_odds), rtol=1e-6)
    np.testing.assert_allclose(c, chosen.numpy(), rtol=1e-6)
    np.testing.assert_allclose(r, rejected.numpy(), rtol=1e-6)
    assert np.isfinite(pl.log1mexp(np.zeros(1))).all()  # a certain completion stays finite


# What is scored ---------------------------------------------------------------------------


def test_a_text_pair_scores_the_completion_and_eos():
  tok = CharTokenizer.train(["the king is dead", "long live"])
  ids, mask = pref.completion_ids(tok, "the king", " is dead")
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids[mask][:-1].tolist()) == " is dead" and mask[-1]
  assert tok.decode(ids[~mask][1:].tolist()) == "the king"


def test_a_conversation_pair_scores_the_last_reply_only():
  tok = CharTokenizer.train(["user: 3+4=\nassistant: 7\nuser: 1+1=\nassistant: 2 3"])
  prompt = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"},
            {"role": "user", "content": "1+1="}]  # fmt: skip
  for reply in ("2", [{"role": "assistant", "content": "2"}]):
    ids, mask = pref.completion_ids(tok, prompt, reply)
    assert ids[mask].tolist() == [*tok.encode("2"), tok.eos_id]  # not the earlier '7'


def test_pairs_are_read_from_jsonl_one_per_row(sft_run, tmp_path):
  exp = experiment.validate(_dpo_config(sft_run), str(tmp_path))
  s = setup.build(exp, str(tmp_path))
  batch = next(iter(s.train_iter))
  tok = s.info.tokenizer
  for side, delta in (("chosen", 0), ("rejected", 1)):
    for inputs, targets, weights, segments in zip(*(batch[f"{side}_{k}"] for k in (
        "inputs", "targets", "weights", "segment_ids")), strict=True):  # fmt: skip
      prompt = tok.decode(inputs[segments > 0].tolist())
      a, b = map(int, prompt.split("user: ")[1].split("=")[0].split("+"))
      assert tok.decode(targets[weights > 0].tolist()) == str(a + b + delta)
      assert set(segments.tolist()) <= {0, 1}  # one pair per row, never packed


# The reference ----------------------------------------------------------------------------


def test_the_reference_is_the_init_weights_frozen_and_checkpointed(sft_run, tmp_path):
  config = _dpo_config(sft_run)
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert math.isfinite(metrics["loss"]) and "logps/chosen" in metrics
  initial = setup.load_trained(sft_run[0])[1]
  state = fh.final_state(str(tmp_path))["state"]
  assert fh.bit_equal(state["frozen"]["reference"], initial) == []  # never trained
  assert fh.bit_equal(state["params"], initial) != []  # the policy was
  assert not any("reference" in jax.tree_util.keystr(k) for k, _ in
                 jax.tree_util.tree_leaves_with_path(state["opt_state"]))  # fmt: skip
  log = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  first = next(r for r in log if r.get("step") == 1 and "rewards/margins" in r)
  import matplotlib.image

  height, width = matplotlib.image.imread(os.path.join(tmp_path, "curves.png")).shape[:2]
  assert (width, height) == (1800, 450)  # loss, learning rate and the reward margin
  # the first update's policy is the reference (to XLA's rounding of the two passes)
  assert abs(first["rewards/margins"]) < 1e-6
  assert math.isclose(first["loss"], math.log(2), rel_tol=1e-6)


def test_under_lora_the_reference_is_the_base_weights_with_no_copy(sft_run, tmp_path):
  config = _dpo_config(sft_run)
  config.model.lora_rank = 4
  exp = experiment.validate(config, str(tmp_path))
  s = setup.build(exp, str(tmp_path))
  assert s.state.frozen is None and s.exp.task.base_reference
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert "rewards/margins" in metrics  # evaluations score against the base weights too
  log = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  first = next(r for r in log if r.get("step") == 1 and "rewards/margins" in r)
  assert abs(first["rewards/margins"]) < 1e-6  # fresh adapters: the policy is the base


@pytest.mark.slow
def test_kill_and_resume_mid_dpo_is_bit_exact(sft_run, tmp_path):
  """train.py killed mid-run, then the same command: the final train state, the frozen
  reference included, equals an uninterrupted run's byte for byte."""
  sft, pairs = sft_run
  flags = (f"--config.init_from={sft}", f"--config.data.tokenizer_from={sft}",
           f"--config.data.path={pairs}", "--config.num_train_steps=12")  # fmt: skip
  env = fh.child_env()
  reference = str(tmp_path / "reference")
  run = fh.Run(fh.train_command(reference, *flags, config=CONFIG), env)
  assert run.wait() == 0, run.output()[-3000:]
  workdir = str(tmp_path / "killed")
  command = fh.train_command(workdir, *flags, config=CONFIG)
  run = fh.Run(command, env)
  killed = fh.interrupt(run, workdir, 0.0, signal.SIGKILL,
                        since=run.wait_for(lambda line: line.startswith("step 8/")))  # fmt: skip
  assert killed["code"] == -signal.SIGKILL and killed["steps"], killed
  run = fh.Run(command, env)
  assert run.wait() == 0, run.output()[-3000:]
  assert "resum" in run.output().lower()
  a, b = fh.final_state(reference), fh.final_state(workdir)
  assert a["step"] == b["step"] == 12
  assert "reference" in b["state"]["frozen"]
  assert fh.bit_equal(a["state"], b["state"]) == []


# Bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("task", "field"),
  [
    ({"beta": 0.0}, "task.beta"),
    ({"loss_type": "kto"}, "task.loss_type"),
    ({"loss_type": "hinge", "label_smoothing": 0.1}, "task.label_smoothing"),
    ({"loss_type": "robust", "label_smoothing": 0.5}, "task.label_smoothing"),
    ({"loss_type": "simpo", "reference": "runs/sft"}, "task.reference"),
    ({"loss_type": "orpo", "sft_weight": 1.0}, "task.sft_weight"),
  ],
)
def test_bad_preference_settings_fail_in_one_line(sft_run, task, field):
  with pytest.raises(ValueError, match=f"^config.{field}=") as error:
    experiment.validate(_dpo_config(sft_run, **task))
  assert "\n" not in str(error.value)


def test_identical_chosen_and_rejected_is_one_line_naming_the_record(sft_run, tmp_path):
  rows = _arith_pairs(4)
  rows[2]["rejected"] = rows[2]["chosen"]
  root = _write_pairs(tmp_path / "pairs", rows, rows[:1])
  cfg = DataConfig(kind="preference", source="hf", path=str(root), eval_split="test")
  splits = sources.open_splits(cfg, str(tmp_path), preference=True)
  tok = CharTokenizer.train(["user: 0123456789+=\nassistant: "])
  example = pref.Pair(tok, 48, source_name=splits.name)
  with pytest.raises(ValueError) as error:
    example((2, splits.train[2]))
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"{root}[record 2]: chosen and rejected")


def test_a_dataset_without_the_pair_columns_names_the_data(sft_run, tmp_path):
  root = tmp_path / "chat"
  root.mkdir()
  (root / "train.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
  config = _dpo_config(sft_run)
  config.data.path = str(root)
  config.data.eval_split = "train"
  exp = experiment.validate(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"^config.data.path=.*'rejected'") as error:
    setup.build(exp, str(tmp_path / "run"))
  assert "\n" not in str(error.value)


def _make_arith_pairs():
  """scripts/make_arith_pairs.py as a module (the package does not import it)."""
  path = Path(__file__).resolve().parents[1] / "scripts" / "make_arith_pairs.py"
  spec = importlib.util.spec_from_file_location("make_arith_pairs", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_dpo_arith_tunes_an_sft_arith_run_on_its_own_wrong_answers(tmp_path):
  """configs/dpo_arith.py's two steps on the pairs scripts/make_arith_pairs.py draws from a
  two-step sft_arith run: each training pair rejects an answer the model sampled, never the
  right one; the held-out pairs are data/arith's test prompts, scored by exact match."""
  sft = tmp_path / "sft"
  train_lib.train_and_evaluate(tiny("sft_arith"), str(sft))
  script = _make_arith_pairs()
  counts = script.write(str(sft), sft / "pairs", prompts=48, samples=2, seed=0)
  train = [json.loads(line) for line in open(sft / "pairs" / "train.jsonl")]
  test = [json.loads(line) for line in open(sft / "pairs" / "test.jsonl")]
  assert counts == {"train": len(train), "test": 1000} and 0 < len(train) <= 48
  references = {c[0]["content"]: c[1]["content"] for c in script.conversations("train")}
  for row in train:
    (turn,), chosen, rejected = row["prompt"], row["chosen"][0], row["rejected"][0]
    assert chosen["content"] == references[turn["content"]] != rejected["content"]
  config = tiny("dpo_arith", init_from=str(sft), **{"evaluate.exact_match.examples": 8})
  config.data.update(path=str(sft / "pairs"), tokenizer_from=str(sft))
  metrics = train_lib.train_and_evaluate(config, str(tmp_path / "dpo"))
  assert math.isfinite(metrics["loss"]) and 0.0 <= metrics["exact_match"] <= 1.0
  assert len(test) == 1000 and {r["prompt"][0]["content"] for r in test}.isdisjoint(references)
