"""grain pipelines of image classification: batches of image f32 [B, H, W, C]
(normalised) and label int32 [B], augmented when training (`features.Image`); a host's
training images of one shape that fit in `IN_MEMORY_IMAGE_BYTES` are read once and
gathered a batch at a time (`features.ImageBatch`). The pipeline's shared steps (sharding,
shuffling, evaluation padding, prefetch) are `pipeline.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np

from transformer.data import features, pipeline

IN_MEMORY_IMAGE_BYTES = 1 << 30  # a host's training images up to this size are held in memory


def in_memory_images(
  source: Sequence, loader: pipeline.Loader, image_key: str = "image", label_key: str = "label"
) -> tuple[np.ndarray, np.ndarray] | None:
  """This host's shard of `source` read once into uint8 [N, H, W, C] images and int32 [N]
  labels, in shard order; None when the images differ in shape or would take more than
  `IN_MEMORY_IMAGE_BYTES` (they are then read record by record)."""
  index, count = loader.host()
  indices = range(index, len(source), count)
  if not len(indices):
    return None
  first = np.asarray(source[indices[0]][image_key])
  if first.dtype != np.uint8 or len(indices) * first.nbytes > IN_MEMORY_IMAGE_BYTES:
    return None
  shape = first.shape if first.ndim == 3 else (*first.shape, 1)  # [H, W, C]
  held = np.empty((len(indices), *shape), np.uint8)
  labels = np.empty(len(indices), np.int32)
  for i, (_, record) in enumerate(features.read_records(source, indices)):
    image = np.asarray(record[image_key])
    if image.shape not in (shape, shape[:2]):
      return None  # sizes vary: record by record
    held[i] = image.reshape(shape)
    labels[i] = record[label_key]
  return held, labels


def image_dataset(
  source: Sequence,
  *,
  batch_size: int,
  train: bool,
  mean: Sequence[float],
  std: Sequence[float],
  seed: int = 0,
  crop_padding: int = 0,
  flip: bool = False,
  image_key: str = "image",
  label_key: str = "label",
  image_size: int | None = None,
  loader: pipeline.Loader = pipeline.Loader(),
) -> grain.IterDataset:
  """Image classification batches (keys image, label); augmentation when training.

  `image_size` first resizes (shorter side) and centre-crops every image to a square,
  for datasets whose images differ in size. Training images of one shape that fit in
  `IN_MEMORY_IMAGE_BYTES` are read once (`in_memory_images`) and each batch is gathered,
  augmented and normalised at once (`features.ImageBatch`): the same images in the same
  order as record by record, without a record read and a transform per image.
  """
  transform = features.Image(
    tuple(mean), tuple(std), crop_padding, flip, image_key, label_key, image_size
  )
  if not train:
    return pipeline.eval_batches(
      pipeline.records(source, loader).map(transform), len(source), batch_size, loader
    )
  held = None if image_size else in_memory_images(source, loader, image_key, label_key)
  if held is not None:  # the same image order; augmented a batch at a time
    batch = features.ImageBatch(*held, tuple(mean), tuple(std), crop_padding, flip)
    ds = pipeline.shuffled(grain.MapDataset.range(len(held[1])), seed, loader)
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.random_map(batch, seed=pipeline.derive_seed(seed, "augment"))
    return pipeline.prefetched(pipeline.to_iter(ds, loader), loader)
  ds = pipeline.shuffled(pipeline.records(source, loader), seed, loader)
  ds = ds.random_map(transform, seed=pipeline.derive_seed(seed, "augment"))
  return pipeline.train_batches(pipeline.to_iter(ds, loader), batch_size, loader)
