"""ViT-Ti/16, S/16, B/16 (Dosovitskiy et al. 2021; Touvron et al. 2021) on ImageNet.

  python train.py --config configs/vit.py:B/16 --workdir runs/vit_b16

Data: the TFDS dataset imagenet2012 at 224 px (the user downloads ImageNet and prepares it
with `tfds build imagenet2012`, which needs TensorFlow; see docs/DATA.md). The DeiT recipe:
AdamW lr 1e-3 (batch 1024), weight decay 0.05, 5 warmup epochs, cosine decay, label
smoothing 0.1, random crops and flips. No reference result on this machine.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

SIZES = ("Ti/16", "S/16", "B/16")


def get_config(arg="B/16"):
  config = common.named_size(__file__, arg, SIZES, "vit")
  config.model.num_classes = 0  # from the data (1000 for ImageNet)
  config.model.dropout_rate = 0.0  # DeiT: no dropout
  d = config.data
  common.image_classification(d, "tfds")
  d.path = "imagenet2012"  # ILSVRC-2012
  d.image_size = 224  # the ImageNet resolution of ViT and DeiT
  d.image_mean = (0.485, 0.456, 0.406)  # ImageNet channel means on [0, 1]
  d.image_std = (0.229, 0.224, 0.225)  # ImageNet channel stds on [0, 1]
  d.crop_padding = 16  # random crops after padding
  d.horizontal_flip = True
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-8
  config.optimizer.weight_decay = 0.05  # DeiT
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "cosine"
  config.schedule.learning_rate = 1e-3  # for batch 1024
  config.schedule.warmup_steps = 6255  # 5 epochs of 1,281,167 images at batch 1024
  config.task.label_smoothing = 0.1  # DeiT
  config.num_train_steps = 375_000  # 300 epochs
  config.batch_size = 1024
  common.evaluate_and_checkpoint(config, 12_510)  # every 10 epochs, the whole split
  common.keep_most_accurate(config)
  return config
