"""Image classification with a Vision Transformer.

Batches: image f32 [B, H, W, C] (normalised per channel; random crops and flips when
training, if configured), label [B] (-1 on padding rows of evaluation batches).
"""

from __future__ import annotations

import dataclasses

import grain

from transformer.data import image_pipeline
from transformer.data.config import IMAGE_SOURCES, DataConfig, fail
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.tasks.labels import Classifying, labels_and_weights


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  return image_pipeline.image_dataset(
    c.source(train),
    batch_size=rows,
    train=train,
    mean=c.image_mean,
    std=c.image_std,
    crop_padding=c.cfg.crop_padding,
    flip=c.cfg.horizontal_flip,
    label_key=c.label_key,
    image_size=c.cfg.image_size,
    **c.common(),
  )


def _shapes(rows: int, s: int, t: int, image_shape) -> dict:
  del s, t
  return {"image": ((rows, *image_shape), F32), "label": ((rows,), I32)}


@dataclasses.dataclass(frozen=True)
class ImageClassification(Classifying):
  name = "image"
  families = ("vit",)
  count_key = None  # throughput in images
  images = True

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if data.source not in (*IMAGE_SOURCES, "tfds"):
      fail("data.source", data.source,
           f"data.kind 'image' reads {', '.join(IMAGE_SOURCES)} or tfds")  # fmt: skip

  def data_spec(self) -> DataSpec:
    return DataSpec(build=_build, shapes=_shapes, images=True, labelled=True)

  def forward(self, model, batch, deterministic):
    logits = model(batch["image"], deterministic=deterministic)  # [B, C]
    return logits, *labels_and_weights(batch)

  def init_args(self, batch):
    return (batch["image"],), {}

  def flops_per_count(self, model, info) -> float:  # per image: its patches (and [CLS])
    tokens = model.num_patches + (model.pooling == "cls")
    return models.flops_per_token(model, tokens) * tokens

  def attention_masks(self, batch):
    return lambda name: (None, None)

  def attention_labels(self, batch, tokenizer):
    return None
