"""The input side: TFDS builders for local files, tokenizers, packing, masking, grain pipelines.

Public API (details in docs/DATA.md):

  make_datasets(data_config, spec, workdir, batch_size, seq_len, seed,
                process_index=None, process_count=None)
      -> (train_iter, eval_iter_factory, info)
    data_config: `DataConfig` or a mapping / ml_collections ConfigDict of its fields.
    spec: the task's `DataSpec` (how records become its batches; transformer/tasks).
    batch_size is global; each host yields batch_size // process_count rows.
    train_iter: `grain.DatasetIterator` of numpy batches; `get_state()` / `set_state()`
      (or `grain.checkpoint.CheckpointSave(train_iter)` under orbax) resume it exactly.
    eval_iter_factory(): a fresh, finite pass over the evaluation split; all hosts get
      the same number of batches (padding rows: weights 0, segment ids 0, label -1).
    info: `DataInfo` (tokenizer, vocab_size, num_classes, label_names, image_shape,
      per-host batch sizes, example counts, eval_batches, stats, batch_shapes()).

  DataConfig (frozen dataclass; `PRESETS` for the shipped data): kind, source, path,
    data_dir, splits, columns, tokenizer, vocab_size, packing, windows, masking,
    image normalisation / augmentation, workers, prefetch, overlong policy.

  Batches of the built-in tasks (B rows on this host, T = seq_len, S = inputs length;
  int32 unless f32):
    lm             inputs, targets (next tokens), weights f32, segment_ids, positions [B, T]
    mlm            inputs (masked), targets (original), weights f32 (1 = predict),
                   segment_ids, positions [B, T]
    classification inputs ([CLS] first), segment_ids, positions [B, T]; label [B]
    seq2seq        inputs, inputs_segment_ids, inputs_positions [B, S];
                   targets (end with EOS; the model shifts right with PAD = 0),
                   targets_segment_ids, targets_positions, weights f32 [B, T]
    image          image f32 [B, H, W, C] normalised; label [B]
  segment_ids: 1, 2, ... per packed example, 0 = padding; positions restart at 0 per example.

  Token ids (every tokenizer): 0 PAD, 1 BOS, 2 EOS, 3 UNK, 4 MASK, 5 CLS, 6 SEP.

Building blocks, usable alone:
  builders.text_corpus / sentence_pairs / labelled_text, image_builders.idx_images /
  image_folder: local files -> prepared TFDS dataset (array_record, no TensorFlow);
  read with `builder.as_data_source()` or `tfds.data_source(name, split=, data_dir=)`.
  tokenizers.CharTokenizer / ByteTokenizer / SentencePieceTokenizer, get_tokenizer,
  load_tokenizer. packing.pack / pad_example / packing_efficiency.
  masking.mask_tokens. images.normalize / augment. pipeline: the task-neutral steps of a
  task's grain pipeline (Batching; examples / windows -> to_rows -> batches); the tasks
  (transformer/tasks) assemble their batches from them.
"""

from transformer.data.config import PRESETS, DataConfig
from transformer.data.datasets import DataInfo, make_datasets
from transformer.data.pipeline import Loader
from transformer.data.spec import DataContext, DataSpec
from transformer.data.tokenizers import (
  BOS_ID,
  CLS_ID,
  EOS_ID,
  MASK_ID,
  NUM_SPECIAL,
  PAD_ID,
  SEP_ID,
  UNK_ID,
  Tokenizer,
  get_tokenizer,
  load_tokenizer,
)

__all__ = [
  "BOS_ID",
  "CLS_ID",
  "DataContext",
  "DataConfig",
  "DataInfo",
  "DataSpec",
  "EOS_ID",
  "Loader",
  "MASK_ID",
  "NUM_SPECIAL",
  "PAD_ID",
  "PRESETS",
  "SEP_ID",
  "Tokenizer",
  "UNK_ID",
  "get_tokenizer",
  "load_tokenizer",
  "make_datasets",
]
