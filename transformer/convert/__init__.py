"""Pretrained checkpoints in and out: Hugging Face directories <-> ModelConfig + parameters.

`hf.load(path)` reads a `save_pretrained` directory (config.json, model.safetensors or
sharded safetensors) into `(ModelConfig, params)`; `hf.save(path, config, params,
architecture)` writes one that `transformers`' `from_pretrained` loads. `registry`
lists the architectures; one module per family holds its mapping (docs/PRETRAINED.md).
Needs the `safetensors` package (the `hf` extra), not PyTorch or `transformers`.
`big_vision.load(path)` reads the `.npz` ViT checkpoints of big_vision and vision_transformer
(NumPy only).
"""

from transformer.convert import big_vision
from transformer.convert.hf import load, save
from transformer.convert.registry import ARCHITECTURES

__all__ = ["ARCHITECTURES", "big_vision", "load", "save"]
