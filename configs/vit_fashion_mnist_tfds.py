"""configs/vit_fashion_mnist.py read from the TFDS dataset fashion_mnist instead of the
shipped IDX files: the same model, recipe and result; only the data source differs.

  python train.py --config configs/vit_fashion_mnist_tfds.py --workdir runs/vit_fmnist_tfds

Data: `tfds build fashion_mnist --file_format=array_record` once (needs TensorFlow; see
docs/DATA.md); the same 60,000 train and 10,000 test images, class names from the
dataset's `ClassLabel`. Result: as configs/vit_fashion_mnist.py, which reads the same
images from data/fashion-mnist.
"""

from transformer.train.config_files import beside


def get_config(arg=None):
  del arg
  config = beside(__file__, "vit_fashion_mnist")
  d = config.data
  d.source = "tfds"
  d.path = "fashion_mnist"  # Xiao et al. 2017
  d.label_names = None  # from the dataset's ClassLabel
  return config
