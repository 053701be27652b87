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

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  # 4 x 4 patches of RGB 32 x 32 images: 64 tokens; augmentation regularises (no dropout).
  config = common.plain_vit(image_size=32, channels=3, patch_size=4, width=256, depth=6, heads=8)
  d = config.data
  common.image_classification(d, "tfds")
  d.path = "cifar10"  # Krizhevsky 2009
  d.image_mean = (0.4914, 0.4822, 0.4465)  # CIFAR-10 training-set channel means on [0, 1]
  d.image_std = (0.2470, 0.2435, 0.2616)  # CIFAR-10 training-set channel stds on [0, 1]
  d.eval_split = "test"  # the 10,000 test images
  d.crop_padding = 4  # random 32x32 crops of the 4-pixel padded image
  d.horizontal_flip = True  # CIFAR's classes look the same mirrored
  d.eval_batch_size = 500
  config.task.label_smoothing = 0.1  # regularises the small-data regime
  # Peak 1e-3 for batch 256 after ~5 epochs of warmup, then decay to 0.
  common.clipped_cosine(config, 1000, learning_rate=1e-3, b2=0.999, weight_decay=0.05)
  config.num_train_steps = 39_000  # 200 epochs of 195 batches
  config.batch_size = 256
  config.log_every = 500
  common.evaluate_and_checkpoint(config, 1950)  # every 10 epochs, the whole test split
  config.best_metric = ""  # no model selection on the test split: keep the last checkpoints
  return config
