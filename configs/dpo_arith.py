"""DPO of the sft_arith run on its own wrong answers to arithmetic prompts, in two rounds:
the second on the first round's own wrong answers (on-policy pairs drawn anew).

  python train.py --config configs/sft_arith.py --workdir runs/sft_arith
  python scripts/make_arith_pairs.py runs/sft_arith        # runs/sft_arith/pairs/
  python train.py --config configs/dpo_arith.py --workdir runs/dpo_arith
  python scripts/make_arith_pairs.py runs/dpo_arith --prompts 6000 --seed 1
  python train.py --config configs/dpo_arith.py:runs/dpo_arith --workdir runs/dpo_arith_2 \
    --config.num_train_steps=300

`data.kind='preference'` on the pairs scripts/make_arith_pairs.py writes beside the SFT
run (default runs/sft_arith; `:DIR` names another): each training pair holds a prompt of
data/arith's train split, its right answer chosen and an answer the SFT model sampled
wrong rejected, as conversations rendered with the plain template (tasks/sft.py). The
policy and the frozen reference both start from the SFT run's weights (`init_from`), whose
tokenizer it reads (`data.tokenizer_from`); the second round starts from, and is
referenced to, the first round's run. Loss: DPO (`task.loss_type='sigmoid'`), beta 0.1,
plus the mean NLL of the chosen answers (`task.sft_weight=1`, RPO), 1,000 updates of 32
pairs at peak learning rate 3e-4 (the second round: 300). Every 250 updates the
`exact_match` evaluator answers the 1,000 held-out prompts greedily, scored against their
right answers, as sft_arith's own evaluation does.
"""

from pathlib import Path

from transformer.train.config_files import load_module
from transformer.train.experiment import task_block

common = load_module(Path(__file__).with_name("common.py"), "configs_common")
sft_arith = load_module(Path(__file__).with_name("sft_arith.py"), "configs_sft_arith")

SFT_WORKDIR = "runs/sft_arith"


def get_config(arg=None):
  sft = arg or SFT_WORKDIR
  config = sft_arith.get_config()
  d = config.data
  d.kind = "preference"
  d.path = f"{sft}/pairs"  # train.jsonl, test.jsonl (scripts/make_arith_pairs.py)
  d.eval_split = "test"
  d.tokenizer_from = sft  # the SFT run's characters
  config.init_from = sft  # the policy's start and the reference
  config.task = task_block("preference")
  config.task.loss_type = "sigmoid"
  config.task.beta = 0.1
  config.task.sft_weight = 1.0  # plus the chosen answers' NLL (RPO): DPO alone lowers it
  common.nanogpt_adamw(config, learning_rate=3e-4)
  config.schedule.warmup_steps = 20
  config.num_train_steps = 1000  # the second round: 300
  config.batch_size = 32  # pairs
  config.log_every = 20
  common.evaluate_and_checkpoint(config, 250)
  config.evaluators = ("exact_match",)  # the greedy answers to the held-out prompts
  config.evaluate.exact_match.every = 250
  return config
