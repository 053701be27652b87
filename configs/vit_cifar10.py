"""A small ViT trained from scratch on CIFAR-10 (the TFDS dataset cifar10).

  python train.py --config configs/vit_cifar10.py --workdir runs/vit_cifar10

Data: `tfds build cifar10 --file_format=array_record` once (needs TensorFlow; see
docs/DATA.md); 50,000 training and 10,000 test images, 32x32x3, read without TensorFlow
(TFDS decodes the PNGs with Pillow). 4x4 patches (64 tokens), six pre-LN blocks of width
256, 2-D sin-cos positions and global average pooling (Beyer et al. 2022, "Better plain
ViT baselines"), random crops after 4-pixel padding and left-right flips; AdamW with
warmup and cosine decay. Evaluated on the test split. No reference result on this
machine (no network to prepare the data).
"""

from transformer.train.experiment import default_config


def get_config(arg=None):
  del arg
  config = default_config()
  m = config.model
  m.family = "vit"  # Vision Transformer
  m.image_size = 32  # 32 x 32 pixels
  m.num_channels = 3  # RGB
  m.patch_size = 4  # 4 x 4 patches: 64 tokens
  m.d_model = 256  # width
  m.num_heads = 8  # attention heads
  m.num_layers = 6  # blocks
  m.d_ff = 512  # 2 * d_model
  m.max_len = 64  # image tokens (validated against the patch grid)
  m.position = "sinusoidal"  # fixed 2-D sin-cos over the patch grid
  m.pooling = "mean"  # global average pooling (no [CLS] token)
  m.num_classes = 0  # from the data: 10 classes
  m.dropout_rate = 0.0  # augmentation regularises instead
  d = config.data
  d.kind = "image"  # image classification batches
  d.source = "tfds"  # a prepared TFDS dataset
  d.path = "cifar10"  # Krizhevsky 2009
  d.tokenizer = "none"  # pixels, not tokens
  d.image_mean = (0.4914, 0.4822, 0.4465)  # CIFAR-10 training-set channel means on [0, 1]
  d.image_std = (0.2470, 0.2435, 0.2616)  # CIFAR-10 training-set channel stds on [0, 1]
  d.eval_split = "test"  # the 10,000 test images
  d.crop_padding = 4  # random 32x32 crops of the 4-pixel padded image
  d.horizontal_flip = True  # random left-right flips
  d.eval_batch_size = 500  # images per evaluation batch
  config.label_smoothing = 0.1  # regularises the small-data regime
  config.optimizer.b2 = 0.999  # AdamW beta2
  config.optimizer.weight_decay = 0.05  # decoupled weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 1e-3  # peak learning rate (batch 256)
  config.schedule.final_fraction = 0.0  # decay to 0
  config.schedule.warmup_steps = 1000  # ~5 epochs of linear warmup
  config.num_train_steps = 39_000  # 200 epochs of 195 batches
  config.batch_size = 256  # images per update
  config.log_every = 500  # console / TensorBoard interval
  config.eval_every = 1950  # every 10 epochs
  config.eval_batches = 0  # the whole test split
  config.checkpoint_every = 1950  # checkpoint interval
  config.best_metric = ""  # no model selection on the test split: keep the last checkpoints
  return config
