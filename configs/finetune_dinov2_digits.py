"""Fine-tune a Hugging Face DINOv2 directory on scikit-learn's bundled 8x8 digits, at an
image size other than the checkpoint's (`hf:DIR`).

The data of configs/vit_digits.py (1,437 train / 360 test digits, no download) from a
`Dinov2ForImageClassification` directory: the model config (layer scale, a head on [CLS]
beside the mean of the patch tokens), the patch embedding, the encoder and the 10-way head
come from it. The digits are resized (bicubic) to `data.image_size`, and the model takes
that size: the checkpoint's position grid is resampled to it once, as HF's DINOv2 does at
any input size (bicubic `interpolate_pos_encoding`), so the run starts from the model HF
runs at that size. The checkpoint must take one channel, as the digits have; a head for
another number of labels keeps its initial values (a fresh 10-way head). With no network,
make a tiny random greyscale DINOv2 (28 x 28 pixels, 14 x 14 patches: a 2 x 2 grid, 10
labels) first; the recipe trains at 42 x 42 (3 x 3 patches):

  python scripts/make_tiny_hf.py runs/tiny_hf dinov2
  python train.py --config configs/finetune_dinov2_digits.py --workdir runs/ft_dinov2

Another directory (DINOv2 was pretrained at 518 px, its classifiers at 224, patches of 14;
any multiple of 14; a pretrained model takes a smaller rate):

  python train.py --config configs/finetune_dinov2_digits.py:path/to/dinov2 --workdir runs/ft \\
    --config.data.image_size=224 --config.schedule.learning_rate=1e-4

The tiny random DINOv2 of scripts/make_tiny_hf.py: width 32, one layer, 9 patches at 42
px. Result: docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/dinov2"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model and weights (no tokenizer)
  config.model.dropout_rate = 0.0  # DINOv2 fine-tuning: no dropout
  common.sklearn_digits(config.data)
  # The model takes this size (a multiple of the patch size): 3 x 3 patches of 14 where the
  # tiny checkpoint has 2 x 2, its position table resampled.
  config.data.image_size = 42
  # Clipped as ViT fine-tuning does; warmup over 10% of the updates. The rate suits the
  # tiny random directory better than finetune_vit_digits' 1e-3.
  common.clipped_cosine(config, 30, learning_rate=3e-3, b2=0.999, weight_decay=0.01)
  common.digits_run(config)
  return config
