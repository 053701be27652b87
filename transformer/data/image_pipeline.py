"""Image records held in memory: a host's training images of one shape that fit in
`IN_MEMORY_IMAGE_BYTES` are read once (`in_memory_images`), so that a pipeline can gather,
augment and normalise them a batch at a time (`features.ImageBatch`) instead of reading and
transforming one record at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

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
