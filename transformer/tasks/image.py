"""Image classification with a Vision Transformer.

Batches: image f32 [B, H, W, C] (normalised per channel; random crops and flips when
training, if configured), label [B] (-1 on padding rows of evaluation batches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain

from transformer.data import features, image_pipeline, pipeline
from transformer.data.config import IMAGE_SOURCES, DataConfig, fail
from transformer.data.pipeline import Batching
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.nn.models import vit
from transformer.tasks.labels import Classifying, labels_and_weights


def image_batches(source: Sequence, image: features.Image, b: Batching) -> grain.IterDataset:
  """Batches of `image(record)` (keys image, label); augmented when training.

  Training images of one shape that fit in `image_pipeline.IN_MEMORY_IMAGE_BYTES` (and need
  no resizing) are read once (`image_pipeline.in_memory_images`) and each batch is
  gathered, augmented and normalised at once (`features.ImageBatch`): the same images in
  the same order as record by record, without a record read and a transform per image.
  """
  if not b.train:
    return pipeline.batches(pipeline.examples(source, b).map(image), len(source), b)
  augment = b.seed_for("augment")
  held = None
  if not image.image_size:
    held = image_pipeline.in_memory_images(source, b.loader, image.image_key, image.label_key)
  if held is not None:
    gather = features.ImageBatch(*held, image.mean, image.std, image.crop_padding, image.flip)
    ds = pipeline.ordered(grain.MapDataset.range(len(held[1])), b)
    ds = ds.batch(b.rows, drop_remainder=True).random_map(gather, seed=augment)
    return pipeline.prefetched(pipeline.to_iter(ds, b.loader), b.loader)
  ds = pipeline.examples(source, b).random_map(image, seed=augment)
  return pipeline.batches(ds, len(source), b)


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  cfg = c.cfg
  image = features.Image(
    tuple(c.image_mean), tuple(c.image_std), cfg.crop_padding, cfg.horizontal_flip,
    label_key=c.label_key, image_size=cfg.image_size,
  )  # fmt: skip
  return image_batches(c.source(train), image, c.batching(train, rows))


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
    if data.source not in (*IMAGE_SOURCES, "tfds", "hf"):
      fail("data.source", data.source,
           f"data.kind 'image' reads {', '.join(IMAGE_SOURCES)}, tfds or hf")  # fmt: skip
    if data.image_size and data.image_size != model.image_size:
      fail("data.image_size", data.image_size, f"must be model.image_size={model.image_size}")

  def data_spec(self) -> DataSpec:
    return DataSpec(build=_build, shapes=_shapes, images=True, labelled=True)

  def loss(self, model, batch, deterministic, frozen):
    del frozen
    return self.cross_entropy(*self.forward(model, batch, deterministic))

  def forward(self, model, batch, deterministic):
    logits = model(batch["image"], deterministic=deterministic)  # [B, C]
    return logits, *labels_and_weights(batch)

  def init_args(self, batch):
    return (batch["image"],), {}

  def flops_per_count(self, model, info) -> float:  # per image: its patches and learned tokens
    tokens = model.num_patches + vit.prefix_tokens(model)
    return models.flops_per_token(model, tokens) * tokens

  def attention_masks(self, batch):
    return lambda name: (None, None)

  def attention_labels(self, batch, tokenizer):
    return None
