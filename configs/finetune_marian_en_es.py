"""Fine-tune a Hugging Face Marian (Opus-MT) directory on English -> Spanish bible verses
(`hf:DIR`).

The data of configs/translate_en_es.py (KJV -> Reina-Valera 1909, BLEU on the 1,574 test
verses) from a `MarianMTModel` directory: the model config (post-LN, sinusoidal positions,
embeddings x sqrt(D), SiLU, one table shared by both sides and the logits), the weights
and the shared SentencePiece vocabulary (its `tokenizer.json`, else `source.spm` +
`vocab.json`) come from it. Marian's PAD (V - 1) and id 0 (its EOS) trade places on
import, in the weights and the tokenizer alike (`convert.marian`): PAD 0 pads the rows and
starts the decoder (`decoder_start_id`, as Marian starts from PAD), EOS V - 1 ends every
source and target and stops decoding. Pairs are packed jointly for training; Marian's
optimizer (Junczys-Dowmunt et al. 2018; the Opus-MT models' settings): Adam betas (0.9,
0.98), eps 1e-9, dropout 0.1. With no network, make a tiny random Marian first:

  python scripts/make_tiny_hf.py runs/tiny_hf marian
  python train.py --config configs/finetune_marian_en_es.py --workdir runs/ft_marian
  python eval.py --workdir runs/ft_marian --bleu_method greedy

An Opus-MT directory as shipped (`source.spm`, `target.spm`, `vocab.json`, no
`tokenizer.json`) loads through `convert.tokenizers` as `MarianTokenizer` encodes the
source side, when its `source.spm` and `target.spm` are the same model: one tokenizer
segments both sides, so a directory whose two SentencePiece models differ is refused
unless it has a `tokenizer.json`. A pretrained model takes a smaller rate:

  python train.py --config configs/finetune_marian_en_es.py:path/to/opus-mt --workdir runs/ft \\
    --config.schedule.learning_rate=5e-5

The tiny random Marian of scripts/make_tiny_hf.py: width 32, one layer each side, 300
pieces + PAD trained on English / Spanish training verses. Its pieces are not T5's, so its
losses and configs/finetune_t5_en_es.py's are not comparable. Result: docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/marian"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model, weights and tokenizer
  m = config.model
  m.max_len = 96  # longest source / target (sinusoidal positions: any length)
  m.dropout_rate = 0.1  # Opus-MT's dropout (runtime fields are the config's)
  m.attention_dropout_rate = 0.0  # Opus-MT's attention_dropout
  common.bible_translation(config.data)  # tokenized by the directory's tokenizer
  config.task.label_smoothing = 0.0  # the loss is the model's own cross-entropy
  # Marian's Adam (betas (0.9, 0.98), eps 1e-9), clipped; warmup over 10% of the updates,
  # then cosine decay to a tenth. The rate suits the tiny random directory.
  common.clipped_cosine(config, 80, 0.1, learning_rate=3e-3, b2=0.98, eps=1e-9)
  config.num_train_steps = 800  # about one epoch of the training pairs
  config.batch_size = 24  # packed rows
  config.seq_len = 96  # tokens per row, source and target
  config.log_every = 100
  common.evaluate_and_checkpoint(config, 400)  # test loss on the whole test split
  config.evaluate.bleu.every = 800  # BLEU at the end only
  config.evaluate.bleu.beam_size = 1  # greedy decoding
  return config
