"""TFDS builders for local images: IDX files (MNIST format) and class-per-folder trees.

Images are stored decoded as `uint8 [H, W, C]` tensors (`tfds.features.Tensor`), not as
PNG (`tfds.features.Image`): encoding PNG inside TFDS needs TensorFlow, raw tensors do
not, and reading raw tensors back needs no image decoder. All images of a dataset must
share one size; a mismatch raises `ValueError` naming the file.

Split rules:
  * IDX: `train` and `test` are the two file sets; with `validation_fraction > 0` the
    last `round(n * validation_fraction)` training images become `validation`.
  * scikit-learn digits (`sklearn_digits`): written once as IDX files, the first 1,437
    images train and the last 360 test (`train_test_split(test_size=0.2, shuffle=False)`).
  * image folder: `root/<split>/<class>/<image>` when `root` holds a `train` folder
    (splits named train / validation / test), else `root/<class>/<image>` split by
    `crc32(relative path)` as for tables (see `builders.hash_split`).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from transformer.data import builders, files

MNIST_FILES = (  # train images, train labels, test images, test labels
  "train-images-idx3-ubyte.gz",
  "train-labels-idx1-ubyte.gz",
  "t10k-images-idx3-ubyte.gz",
  "t10k-labels-idx1-ubyte.gz",
)
FASHION_MNIST_LABELS = (  # Xiao et al. 2017, Table 1 (label order)
  "T-shirt/top",
  "Trouser",
  "Pullover",
  "Dress",
  "Coat",
  "Sandal",
  "Shirt",
  "Sneaker",
  "Bag",
  "Ankle boot",
)
DIGITS_FILES = tuple(n.removesuffix(".gz") for n in MNIST_FILES)  # written uncompressed
DIGITS_TEST_COUNT = 360  # scikit-learn digits: the last 20% of the 1,797 images are test
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclasses.dataclass
class ImageConfig(builders.LocalConfig):
  files: tuple[str, ...] = MNIST_FILES  # IDX: file names inside `path`
  label_names: tuple[str, ...] | None = None  # IDX: None = "0", "1", ...
  channels: int | None = None  # image folder: 1 or 3; None = from the first image
  validation_fraction: float = 0.0
  test_fraction: float = 0.0


def _idx_header_shape(path: Path) -> tuple[int, ...]:
  """The array shape in an IDX header, reading only the header."""
  opener = gzip.open if path.name.endswith(".gz") else open
  with opener(path, "rb") as f:
    head = f.read(4)
    if len(head) < 4:
      raise ValueError(f"{path}: not an IDX file (shorter than 4 bytes)")
    dims = f.read(4 * head[3])
  if len(dims) != 4 * head[3]:
    raise ValueError(f"{path}: truncated IDX header")
  return tuple(int(d) for d in np.frombuffer(dims, ">u4"))


class LocalIdxImages(builders.LocalBuilder):
  """Four IDX files (train/test images and labels) -> {'image', 'label', 'index'}."""

  BUILDER_CONFIG_CLASS = ImageConfig
  builder_config: ImageConfig

  def _paths(self) -> list[Path]:
    root = files.existing(self.builder_config.path)
    return [files.existing(root / name) for name in self.builder_config.files]

  @functools.cached_property
  def image_shape(self) -> tuple[int, int, int]:
    path = self._paths()[0]
    shape = _idx_header_shape(path)
    if len(shape) not in (3, 4):
      raise ValueError(f"{path}: IDX images must be [N, H, W] or [N, H, W, C], got {shape}")
    return (*shape[1:3], shape[3] if len(shape) == 4 else 1)

  def _features(self) -> tfds.features.FeaturesDict:
    names = self.builder_config.label_names
    return tfds.features.FeaturesDict(
      {
        "image": tfds.features.Tensor(shape=self.image_shape, dtype=np.uint8),
        "label": tfds.features.ClassLabel(names=names)
        if names
        else tfds.features.ClassLabel(num_classes=10),
        "index": np.int64,
      }
    )

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    cfg = self.builder_config
    num_classes = len(cfg.label_names) if cfg.label_names else 10
    out: dict[str, list[dict[str, Any]]] = {}
    paths = self._paths()
    for split, (img_path, lbl_path) in zip(("train", "test"), (paths[:2], paths[2:]), strict=True):
      images, labels = files.read_idx(img_path), files.read_idx(lbl_path)
      images = images.reshape(*images.shape[:3], -1)  # [N, H, W, C]
      if images.dtype != np.uint8 or images.shape[1:] != self.image_shape:
        raise ValueError(
          f"{img_path}: expected uint8 images of shape {self.image_shape}, "
          f"got {images.dtype} {images.shape[1:]}"
        )
      if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
          f"{lbl_path}: {labels.shape} labels for {len(images)} images in {img_path}"
        )
      bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
      if bad.size:
        raise ValueError(
          f"{lbl_path}: label {labels[bad[0]]} of item {bad[0]} is outside [0, {num_classes})"
        )
      out[split] = [
        {"image": im, "label": int(lb), "index": i}
        for i, (im, lb) in enumerate(zip(images, labels, strict=True))
      ]
    n_val = round(len(out["train"]) * cfg.validation_fraction)
    if n_val:
      out["train"], out["validation"] = out["train"][:-n_val], out["train"][-n_val:]
    return out


def _load_image(path: Path, channels: int | None) -> np.ndarray:
  from PIL import Image  # Pillow; imported here so text-only users never need it.

  try:
    with Image.open(path) as im:
      if channels is None:
        channels = 1 if im.mode in ("1", "L", "I;16", "I", "F") else 3
      im = im.convert("L" if channels == 1 else "RGB")
      arr = np.asarray(im, np.uint8)
  except (OSError, SyntaxError) as e:
    raise ValueError(f"{path}: cannot read image ({e})") from e
  return arr.reshape(*arr.shape[:2], channels)


class LocalImageFolder(builders.LocalBuilder):
  """`root/[split/]class/image` -> {'image', 'label', 'file'}; classes = sorted folder names."""

  BUILDER_CONFIG_CLASS = ImageConfig
  builder_config: ImageConfig

  @functools.cached_property
  def _listing(self) -> tuple[tuple[str, ...], dict[str, list[tuple[Path, str]]]]:
    """(class names, split -> [(file, class)]) from the folder tree."""
    cfg = self.builder_config
    root = files.existing(cfg.path)
    if not root.is_dir():
      raise ValueError(f"{root}: expected a folder of class folders")
    split_dirs = {s: root / s for s in builders.SPLITS if (root / s).is_dir()}
    by_split: dict[str, list[tuple[Path, str]]] = {}
    if "train" in split_dirs:
      for split, d in split_dirs.items():
        by_split[split] = [
          (f, c.name) for c in sorted(d.iterdir()) if c.is_dir() for f in _images(c)
        ]
      classes = sorted({c for _, c in by_split["train"]})
    else:
      items = [(f, c.name) for c in sorted(root.iterdir()) if c.is_dir() for f in _images(c)]
      classes = sorted({c for _, c in items})
      by_split = {s: [] for s in builders.SPLITS}
      for f, c in items:
        key = str(f.relative_to(root))
        by_split[builders.hash_split(key, cfg.validation_fraction, cfg.test_fraction)].append(
          (f, c)
        )
      by_split = builders.nonempty_splits(
        by_split, cfg.path, cfg.validation_fraction, cfg.test_fraction
      )
    if not classes or not by_split.get("train"):
      raise ValueError(f"{root}: no images found in class folders ({', '.join(IMAGE_SUFFIXES)})")
    for split, items in by_split.items():
      for f, c in items:
        if c not in classes:
          raise ValueError(f"{f}: class {c!r} of split {split!r} does not occur in 'train'")
    return tuple(classes), by_split

  @functools.cached_property
  def image_shape(self) -> tuple[int, int, int]:
    first = self._listing[1]["train"][0][0]
    return _load_image(first, self.builder_config.channels).shape

  def _features(self) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
      {
        "image": tfds.features.Tensor(shape=self.image_shape, dtype=np.uint8),
        "label": tfds.features.ClassLabel(names=self._listing[0]),
        "file": tfds.features.Text(),
      }
    )

  def _parse(self) -> dict[str, list[dict[str, Any]]]:
    classes, by_split = self._listing
    root, channels = Path(self.builder_config.path), self.image_shape[-1]
    first = by_split["train"][0][0]
    out = {}
    for split, items in by_split.items():
      out[split] = []
      for f, c in items:
        image = _load_image(f, channels)
        if image.shape != self.image_shape:
          raise ValueError(
            f"{f}: image is {image.shape} (H, W, C), but {first} is {self.image_shape}"
          )
        out[split].append(
          {"image": image, "label": classes.index(c), "file": str(f.relative_to(root))}
        )
    return out


def _images(folder: Path) -> list[Path]:
  return sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)


def idx_images(
  path: str | os.PathLike,
  data_dir: str | os.PathLike | None = None,
  *,
  name: str | None = None,
  file_names: tuple[str, str, str, str] = MNIST_FILES,
  label_names: tuple[str, ...] | None = None,
  validation_fraction: float = 0.0,
) -> tfds.core.DatasetBuilder:
  """Prepares a folder of four IDX files as a `local_idx_images` dataset."""
  root = files.existing(path)
  paths = [files.existing(root / n) for n in file_names]
  labels = None if label_names is None else tuple(label_names)
  idx = {"files": tuple(file_names), "label_names": labels}
  cfg = ImageConfig.pending(path, validation_fraction, ImageConfig.test_fraction, **idx)
  return builders.prepare_named(LocalIdxImages, cfg, paths, data_dir, name)


def image_folder(
  path: str | os.PathLike,
  data_dir: str | os.PathLike | None = None,
  *,
  name: str | None = None,
  channels: int | None = None,
  validation_fraction: float = 0.0,
  test_fraction: float = 0.0,
) -> tfds.core.DatasetBuilder:
  """Prepares a class-per-folder image tree as a `local_image_folder` dataset.

  The fingerprint covers file names, sizes and modification times (not content), so
  large trees are not re-read on every start.
  """
  root = files.existing(path)
  paths = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
  cfg = ImageConfig.pending(path, validation_fraction, test_fraction, channels=channels)
  rel = [str(p.relative_to(root)) for p in paths]
  return builders.prepare_named(LocalImageFolder, cfg, paths, data_dir, name, rel, content=False)


def sklearn_digits(
  folder: str | os.PathLike,
  data_dir: str | os.PathLike | None = None,
  *,
  validation_fraction: float = 0.0,
) -> tfds.core.DatasetBuilder:
  """scikit-learn's bundled 8x8 digits (1,797 images, UCI optdigits) as `local_idx_images`.

  At first use the images are written to `folder` as four uncompressed IDX files,
  pixels scaled from [0, 16] to [0, 255] (uint8 [N, 8, 8]); the last `DIGITS_TEST_COUNT`
  images are the test split. Needs scikit-learn (a test dependency; no network).
  """
  folder = Path(folder)
  if not all((folder / n).exists() for n in DIGITS_FILES):
    try:
      from sklearn.datasets import load_digits
    except ImportError as e:
      raise ImportError("DataConfig.source 'sklearn_digits' needs scikit-learn") from e
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)  # [N, 8, 8]
    labels = digits.target.astype(np.uint8)  # [N]
    n = len(images) - DIGITS_TEST_COUNT
    arrays = (images[:n], labels[:n], images[n:], labels[n:])
    for name, array in zip(DIGITS_FILES, arrays, strict=True):
      files.write_idx(folder / name, array)
  return idx_images(
    folder,
    data_dir,
    file_names=DIGITS_FILES,
    label_names=tuple(str(d) for d in range(10)),
    validation_fraction=validation_fraction,
  )
