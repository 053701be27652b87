"""Fine-tune a Hugging Face ViT directory on scikit-learn's bundled 8x8 digits (`hf:DIR`).

The data of configs/vit_digits.py (1,437 train / 360 test digits, no download) from a
`ViTForImageClassification` directory: the model config ([CLS] pooling, learned
positions), the patch embedding, the encoder and the 10-way head come from it. The
digits are resized (bicubic) to the checkpoint's resolution, as fine-tuning a pretrained
ViT does; the checkpoint must take one channel and have 10 labels (a head of another
size, or RGB, is refused in one line). With no network, make a tiny random greyscale ViT
(32 x 32 pixels, 16 x 16 patches, 10 labels) first:

  python scripts/make_tiny_hf.py runs/tiny_hf vit
  python train.py --config configs/finetune_vit_digits.py --workdir runs/ft_vit

Another directory (its image_size in place of 32; a pretrained ViT takes a smaller rate):

  python train.py --config configs/finetune_vit_digits.py:path/to/vit --workdir runs/ft \\
    --config.data.image_size=224 --config.schedule.learning_rate=1e-4

The tiny random ViT of scripts/make_tiny_hf.py: width 32, one layer, 4 patches; its head,
[CLS] and biases random, not zero. Result: docs/FINETUNING.md.
"""

from pathlib import Path

from transformer.train.config_files import load_module

common = load_module(Path(__file__).with_name("common.py"), "configs_common")

DEFAULT_DIR = "runs/tiny_hf/vit"  # written by scripts/make_tiny_hf.py


def get_config(arg=None):
  config = common.from_hf(arg, DEFAULT_DIR)  # model and weights (no tokenizer)
  config.model.dropout_rate = 0.0  # ViT fine-tuning: no dropout
  common.sklearn_digits(config.data)
  config.data.image_size = 32  # resized to the checkpoint's image_size (make_tiny_hf's ViT)
  # Clipped as ViT fine-tuning does; warmup over 10% of the updates.
  common.clipped_cosine(config, 30, learning_rate=1e-3, b2=0.999, weight_decay=0.01)
  common.digits_run(config)
  return config
