"""Evaluates a training workdir.

  python eval.py --workdir DIR [--checkpoint STEP] [--eval_batches N]
  python eval.py --workdir DIR --prompt "ROMEO:" --num_samples 3 --temperature 0.8 --top_k 40
  python eval.py --workdir DIR --bleu_method greedy          # translation runs
  python eval.py --workdir DIR --analyze [--prompt TEXT]     # attention statistics, heatmaps

LMs: loss and perplexity (and samples for each --prompt); translation: corpus BLEU with
sacrebleu (beam search by default); classifiers and ViT: accuracy and a confusion matrix
(table, and DIR/confusion_step_<STEP>.png). Everything goes to DIR/eval_step_<STEP>.json.
The command itself is `transformer/eval_main.py` (installed as `transformer-eval`).
"""

from transformer.eval_main import run

if __name__ == "__main__":
  run()
