"""A seconds-long ViT smoke recipe on scikit-learn's bundled 8x8 digits (no download).

`data.source='sklearn_digits'` writes the 1,797 images (UCI optdigits, pixels 0..16
scaled to 0..255) once as IDX files under WORKDIR/datasets/sklearn_digits/: the first
1,437 train, the last 360 test. 4x4 patches (4 tokens), two blocks of width 64, mean pooling,
2-D sin-cos positions. Needs scikit-learn (a test dependency).

  python train.py --config configs/vit_digits.py --workdir runs/vit_digits

Result: docs/RESULTS.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")


def get_config(arg=None):
  del arg
  # 4 x 4 patches of the 8 x 8 digits: 4 tokens (2 x 2 patches overfit).
  config = common.plain_vit(image_size=8, channels=1, patch_size=4, width=64, depth=2, heads=4)
  common.sklearn_digits(config.data)
  common.clipped_cosine(config, 20, learning_rate=3e-3, b2=0.99, weight_decay=0.01)
  common.digits_run(config)
  return config
