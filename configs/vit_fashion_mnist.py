"""A small ViT on Fashion-MNIST (shipped IDX files), trained from scratch on a CPU.

4x4 patches of the 28x28 images (49 tokens), four pre-LN blocks of width 128, 2-D sin-cos
positions, global average pooling (Beyer et al. 2022, "Better plain ViT baselines"),
left-right flips; AdamW with warmup and cosine decay. Evaluated on the 10,000 test images.

  python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit_fashion_mnist

No random crops or label smoothing: with them the training loss stays at the test loss
(the model underfits in 15 epochs); 2x2 patches (196 tokens) are too slow for a CPU run.
The images are held in memory and augmented a batch at a time (tasks/image.py), so the
host adds little. Result and wall time: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.data.image_builders import FASHION_MNIST_LABELS
from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  # 4 x 4 patches of greyscale 28 x 28 images: 49 tokens; flips regularise (no dropout).
  config = common.plain_vit(image_size=28, channels=1, patch_size=4, width=128, depth=4, heads=4)
  d = config.data
  common.image_classification(d, "idx")  # the four IDX files
  d.path = "data/fashion-mnist"  # shipped with the project
  d.label_names = FASHION_MNIST_LABELS  # Xiao et al. 2017, Table 1
  d.image_mean = (0.2860,)  # measured on the training images (docs/DATA.md)
  d.image_std = (0.3530,)  # measured on the training images
  d.eval_split = "test"  # the 10,000 test images
  d.validation_fraction = 0.0  # no validation split: train on all 60,000
  d.test_fraction = 0.0  # (the test split is fixed by the files)
  d.crop_padding = 0  # no random crops: with them the model underfits in 15 epochs
  d.horizontal_flip = True  # clothes are symmetric enough
  d.eval_batch_size = 500
  config.task.label_smoothing = 0.0  # it did not help in 15 epochs
  common.clipped_cosine(config, 300, learning_rate=2e-3, b2=0.99, weight_decay=0.05)
  config.num_train_steps = 7000  # 15 epochs
  config.batch_size = 128
  config.log_every = 500
  common.evaluate_and_checkpoint(config, 1750)  # the whole test split
  common.keep_most_accurate(config)
  return config
