"""A small ViT on Fashion-MNIST (shipped IDX files), trained from scratch on a CPU.

4x4 patches of the 28x28 images (49 tokens), four pre-LN blocks of width 64, 2-D sin-cos
positions, global average pooling (Beyer et al. 2022, "Better plain ViT baselines"),
left-right flips; AdamW with warmup and cosine decay. Evaluated on the 10,000 test images.

  python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit_fashion_mnist

Result (2-core CPU shared with other jobs, load average ~5): 3,500 steps (7.5 epochs) in
994 s wall (522 s user + 322 s system CPU), test accuracy 88.56% (loss 0.319); 79.9%,
82.0%, 82.6%, 85.8%, 87.7%, 88.3% at steps 500..3000. Short of the 91% target: the
curve is still rising as the learning rate decays, so the target needs more epochs
than 20 CPU-minutes buy here (e.g. 6 blocks and ~15 epochs: about 50 minutes).
"""

from transformer.data.image_builders import FASHION_MNIST_LABELS
from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "vit"  # Vision Transformer
  m.image_size = 28  # 28 x 28 pixels
  m.num_channels = 1  # greyscale
  m.patch_size = 4  # 4 x 4 patches: 49 tokens
  m.d_model = 64  # width
  m.num_heads = 4  # attention heads
  m.num_layers = 4  # blocks
  m.d_ff = 128  # 2 * d_model
  m.max_len = 49  # image tokens (validated against the patch grid)
  m.position = "sinusoidal"  # fixed 2-D sin-cos over the patch grid
  m.pooling = "mean"  # global average pooling (no [CLS] token)
  m.num_classes = 0  # from the data: 10 classes
  m.dropout_rate = 0.0  # augmentation regularises instead
  d = config.data
  d.kind = "image"  # image classification batches
  d.source = "idx"  # the four IDX files
  d.path = "data/fashion-mnist"  # shipped with the project
  d.tokenizer = "none"  # pixels, not tokens
  d.label_names = FASHION_MNIST_LABELS  # Xiao et al. 2017, Table 1
  d.image_mean = (0.2860,)  # measured on the training images (docs/DATA.md)
  d.image_std = (0.3530,)  # measured on the training images
  d.eval_split = "test"  # the 10,000 test images
  d.validation_fraction = 0.0  # no validation split: train on all 60,000
  d.test_fraction = 0.0  # (the test split is fixed by the files)
  d.crop_padding = 0  # no random crops: a few epochs do not overfit, crops slow learning
  d.horizontal_flip = True  # random left-right flips (clothes are symmetric enough)
  d.eval_batch_size = 500  # images per evaluation batch
  config.label_smoothing = 0.0  # none (short run)
  config.optimizer.b2 = 0.99  # AdamW beta2
  config.optimizer.weight_decay = 0.05  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 2e-3  # peak learning rate
  config.schedule.final_fraction = 0.0  # decay to 0
  config.schedule.warmup_steps = 200  # linear warmup
  config.num_train_steps = 3500  # updates (7.5 epochs)
  config.batch_size = 128  # images per update
  config.log_every = 200  # console / TensorBoard interval
  config.eval_every = 500  # test-accuracy interval
  config.eval_batches = 0  # the whole test split
  config.checkpoint_every = 500  # checkpoint interval
  config.best_metric = "accuracy"  # keep the most accurate checkpoint
  config.best_mode = "max"  # higher is better
  return config
