"""ViT-Ti/16, S/16, B/16 (Dosovitskiy et al. 2021; Touvron et al. 2021) on ImageNet.

  python train.py --config configs/vit.py:B/16 --workdir runs/vit_b16

Data: the TFDS dataset imagenet2012 at 224 px (the user downloads ImageNet and prepares it
with `tfds build imagenet2012`, which needs TensorFlow; see docs/DATA.md). The DeiT recipe:
AdamW lr 1e-3 (batch 1024), weight decay 0.05, 5 warmup epochs, cosine decay, label
smoothing 0.1, random crops and flips. No reference result on this machine.
"""

from transformer.nn.sizes import NAMED_SIZES
from transformer.train.experiment import default_config

SIZES = ("Ti/16", "S/16", "B/16")


def get_config(arg="B/16"):
  if arg not in SIZES:
    raise ValueError(f"configs/vit.py: size must be one of {SIZES}, got {arg!r}")
  config = default_config()
  config.model.update(NAMED_SIZES[f"vit_{arg.lower()}"])  # see transformer/nn/config.py
  config.model.num_classes = 0  # from the data (1000 for ImageNet)
  config.model.dropout_rate = 0.0  # DeiT: no dropout
  config.data.kind = "image"  # image classification
  config.data.source = "tfds"  # a prepared TFDS dataset
  config.data.path = "imagenet2012"  # ILSVRC-2012
  config.data.tokenizer = "none"  # pixels, not tokens
  config.data.image_size = 224  # images resized to 224 x 224
  config.data.image_mean = (0.485, 0.456, 0.406)  # ImageNet channel means on [0, 1]
  config.data.image_std = (0.229, 0.224, 0.225)  # ImageNet channel stds on [0, 1]
  config.data.crop_padding = 16  # random crops after padding
  config.data.horizontal_flip = True  # random flips
  config.optimizer.b2 = 0.999  # AdamW beta2
  config.optimizer.eps = 1e-8  # AdamW epsilon
  config.optimizer.weight_decay = 0.05  # DeiT weight decay
  config.optimizer.clip_norm = 1.0  # global-norm clipping
  config.schedule.kind = "cosine"  # warmup then cosine decay
  config.schedule.learning_rate = 1e-3  # peak for batch 1024
  config.schedule.warmup_steps = 6255  # 5 epochs of 1,281,167 images at batch 1024
  config.label_smoothing = 0.1  # DeiT
  config.num_train_steps = 375_000  # 300 epochs
  config.batch_size = 1024  # images per update
  config.eval_every = 12_510  # every 10 epochs
  config.checkpoint_every = 12_510  # checkpoint interval
  config.best_metric = "accuracy"  # keep the most accurate checkpoint
  config.best_mode = "max"  # higher is better
  return config
