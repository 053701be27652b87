"""A seconds-long ViT smoke recipe on scikit-learn's bundled 8x8 digits (no download).

`data.source='sklearn_digits'` writes the 1,797 images (UCI optdigits, pixels 0..16
scaled to 0..255) once as IDX files under WORKDIR/datasets/sklearn_digits/: the first
1,437 train, the last 360 test (scikit-learn's logistic regression scores 90.0% on this
split, an RBF SVM 95.8%). 4x4 patches (4 tokens), two blocks of width 64, mean pooling,
2-D sin-cos positions. Needs scikit-learn (a test dependency).

  python train.py --config configs/vit_digits.py --workdir runs/vit_digits

Result (2-core CPU, shared): 300 steps in 22 s wall (16 s CPU; first use, IDX writing and
dataset preparation included), test accuracy 91.9% (loss 0.326) on the 360 test digits.
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "vit"  # Vision Transformer
  m.image_size = 8  # 8 x 8 pixels
  m.num_channels = 1  # greyscale
  m.patch_size = 4  # 4 x 4 patches: 4 tokens (2 x 2 patches overfit: 79% test accuracy)
  m.d_model = 64  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 2  # blocks
  m.d_ff = 128  # 2 * d_model
  m.max_len = 4  # image tokens (validated against the patch grid)
  m.position = "sinusoidal"  # fixed 2-D sin-cos over the patch grid
  m.pooling = "mean"  # global average pooling (no [CLS] token)
  m.num_classes = 0  # from the data: 10 digits
  m.dropout_rate = 0.0  # seconds-long run
  d = config.data
  d.kind = "image"  # image classification batches
  d.source = "sklearn_digits"  # scikit-learn's load_digits(), written as IDX at first use
  d.tokenizer = "none"  # pixels, not tokens
  d.eval_split = "test"  # the last 360 digits
  d.validation_fraction = 0.0  # no validation split
  d.test_fraction = 0.0  # (the test split is fixed by the source)
  config.optimizer.b2 = 0.99  # AdamW beta2
  config.optimizer.weight_decay = 0.01  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 3e-3  # peak learning rate
  config.schedule.warmup_steps = 20  # linear warmup
  config.num_train_steps = 300  # updates (about 13 epochs)
  config.batch_size = 64  # images per update
  config.log_every = 50  # console / TensorBoard interval
  config.eval_every = 0  # evaluate at the end only
  config.eval_batches = 0  # the whole test split
  config.checkpoint_every = 300  # checkpoint at the end
  config.best_metric = "accuracy"  # keep the most accurate checkpoint
  config.best_mode = "max"  # higher is better
  return config
