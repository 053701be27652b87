"""Tiny random Hugging Face model directories, to try `init_from='hf:DIR'` with no network.

  python scripts/make_tiny_hf.py runs/tiny_hf   # gpt2/ ... t5/ marian/ vit/ dinov2/ (FAMILIES)
  python scripts/make_tiny_hf.py runs/tiny_hf gpt2 t5    # only these

Each directory is what `save_pretrained` writes (config.json, model.safetensors), with
random weights from our own initialisation written by `transformer.convert.save`, and a
tokenizer trained on the first lines of data/tinyshakespeare.txt.gz where the family has
one: GPT-2 a byte-level BPE (`tokenizer.json`, `<|endoftext|>` as BOS = EOS = UNK; a chat
template of 'role: content<|endoftext|>' turns, `GPT2_CHAT`, for configs/sft_chat.py), BERT
a WordPiece (`tokenizer.json`, [PAD] [UNK] [CLS] [SEP] [MASK]), Llama a SentencePiece BPE
(`tokenizer.model`, UNK 0, BOS 1, EOS 2; Mixtral and Gemma 2 the same kind), T5 a
SentencePiece unigram (`spiece.model`, PAD 0,
EOS 1, UNK 2, 100 sentinels), trained also on English and Spanish verses of
data/bible_kjv_rv1909_en_es.tsv.gz from its training split (T5's vocabulary covers several
languages; configs/finetune_t5_en_es.py needs the Spanish letters). Marian (`MarianMTModel`,
Opus-MT's layout: SiLU, embeddings x sqrt(D), sinusoidal positions, one table shared by
both sides and the logits) a SentencePiece unigram trained on those verses only, in
Marian's ids: EOS `</s>` 0, UNK 1, the pieces, PAD V - 1, the decoder starting from PAD.
It is written as Opus-MT ships it (`source.spm` = `target.spm`, `vocab.json`, read by
transformers' `MarianTokenizer`) and as the `tokenizer.json` of the same unigram, which
`convert.tokenizers` reads. ViT has none; it is greyscale, 32 x 32 pixels in 16 x 16
patches, 10 labels (the shipped digits resized, as configs/finetune_vit_digits.py reads
them). DINOv2 has none either: greyscale, 28 x 28
pixels in 14 x 14 patches (DINOv2's patch size, a 2 x 2 grid), 10 labels, layer scale 0.5,
feed-forward 2 x width; configs/finetune_dinov2_digits.py fine-tunes it at 42 x 42 pixels
(its position table resampled to 3 x 3). For ViT, DINOv2 and Marian the tensors our
initialisation leaves at zero (ViT's and DINOv2's head, [CLS] and biases; Marian's biases
and `final_logits_bias`) are drawn at random (`PERTURBED`), so that each, with DINOv2's
table and Marian's PAD swap, shows in the first loss. Sizes: width 32, 2 heads, 1 layer
(each side), feed-forward 64, 64 positions (the sizes tests/test_recipes.py shrinks every
config to). Mixtral has 4 experts, 2 per token; Gemma 2 its soft caps, sandwich norms,
(1 + w) RMSNorm, tanh GeGLU and 16-wide heads, with a 32-token window on its one (local)
layer. The weights are random: the point is the path (config, weights, tokenizer), not
the predictions.

Needs the `hf` extra (safetensors, tokenizers, sentencepiece), not PyTorch or
`transformers`. Not imported by the package; tests load it by path.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
from pathlib import Path

import jax

from transformer import convert
from transformer.convert import registry
from transformer.data.builders import hash_split
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "data" / "tinyshakespeare.txt.gz"
VERSES = REPO / "data" / "bible_kjv_rv1909_en_es.tsv.gz"
WIDTH, HEADS, LAYERS, FFN, MAX_LEN = 32, 2, 1, 64, 64
FAMILIES = ("gpt2", "bert", "llama", "mixtral", "gemma2", "t5", "marian", "vit", "dinov2")
PERTURBED = ("vit", "dinov2", "marian")  # all-zero initial tensors drawn from N(0, 0.02^2) (`make`)
END = "<|endoftext|>"


def corpus(lines: int = 400) -> list[str]:
  """The first non-empty lines of the shipped Shakespeare text."""
  with gzip.open(TEXT, "rt", encoding="utf-8") as f:
    out = []
    for line in f:
      if line.strip():
        out.append(line.rstrip("\n"))
      if len(out) == lines:
        break
  return out


def verses(pairs: int = 200) -> list[str]:
  """English and Spanish text of the first `pairs` verse pairs of the shipped bible TSV that
  fall in the training split of the recipes' default 5% / 5% hash split (no held-out verse)."""
  out = []
  with gzip.open(VERSES, "rt", encoding="utf-8") as f:
    header = next(f).rstrip("\n").split("\t")
    for line in f:
      row = dict(zip(header, line.rstrip("\n").split("\t"), strict=True))
      if hash_split(row[header[0]], 0.05, 0.05) == "train":
        out += [row["en"], row["es"]]
      if len(out) == 2 * pairs:
        break
  return out


def texts_for(family: str) -> list[str]:
  """The default tokenizer training text of `family`."""
  if family == "marian":
    return verses()  # an English -> Spanish model's vocabulary
  return corpus() + verses() if family == "t5" else corpus()


def _write_config(path: Path, **tokens: str) -> None:
  (path / "tokenizer_config.json").write_text(json.dumps(tokens, indent=2) + "\n")


# The tiny GPT-2's chat template: each turn 'role: content' then EOS, after a newline.
GPT2_CHAT = (
  "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
  "{% if add_generation_prompt %}assistant: {% endif %}"
)


def gpt2_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> int:
  """A byte-level BPE with `<|endoftext|>` as the last id; returns the vocabulary size."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )  # fmt: skip
  tok.train_from_iterator(texts, trainer)
  tok.add_special_tokens([END])  # the last id, as GPT-2's 50256
  tok.save(str(path / "tokenizer.json"))
  _write_config(path, bos_token=END, eos_token=END, unk_token=END, chat_template=GPT2_CHAT)
  return tok.get_vocab_size(with_added_tokens=True)


def bert_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> int:
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  specials = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # BERT's order
  trainer = trainers.WordPieceTrainer(
    vocab_size=vocab_size, special_tokens=specials, show_progress=False
  )
  tok.train_from_iterator(texts, trainer)
  tok.save(str(path / "tokenizer.json"))
  roles = ("pad", "unk", "cls", "sep", "mask")
  _write_config(path, **{f"{r}_token": f"[{r.upper()}]" for r in roles})
  return tok.get_vocab_size(with_added_tokens=True)


def _sentencepiece(texts: list[str], vocab_size: int, **ids) -> bytes:
  import sentencepiece as spm

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
    hard_vocab_limit=False, num_threads=1, minloglevel=2, **ids,
  )  # fmt: skip
  return model.getvalue()


def llama_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> int:
  import sentencepiece as spm

  proto = _sentencepiece(texts, vocab_size, model_type="bpe", unk_id=0, bos_id=1, eos_id=2)
  (path / "tokenizer.model").write_bytes(proto)
  _write_config(path, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
  return spm.SentencePieceProcessor(model_proto=proto).get_piece_size()


def t5_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> int:
  import sentencepiece as spm

  proto = _sentencepiece(
    texts, vocab_size, model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1
  )
  (path / "spiece.model").write_bytes(proto)
  _write_config(path, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", extra_ids=100)
  return spm.SentencePieceProcessor(model_proto=proto).get_piece_size() + 100


def marian_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> int:
  """A SentencePiece unigram in Marian's ids (EOS 0, UNK 1, PAD last), written both as
  Opus-MT ships it and as `tokenizer.json`; returns the vocabulary size (pieces + PAD)."""
  import sentencepiece as spm
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

  proto = _sentencepiece(
    texts, vocab_size, model_type="unigram", eos_id=0, unk_id=1, bos_id=-1, pad_id=-1
  )
  sp = spm.SentencePieceProcessor(model_proto=proto)
  pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
  vocab = [*pieces, ("<pad>", 0.0)]  # Marian appends PAD after the pieces
  for name in ("source.spm", "target.spm"):  # one shared vocabulary
    (path / name).write_bytes(proto)
  ids = {piece: i for i, (piece, _) in enumerate(vocab)}
  (path / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False, indent=1) + "\n")
  spec = sentencepiece_model_pb2.ModelProto.FromString(proto).normalizer_spec
  # SentencePiece's own text handling: its normaliser (nmt_nfkc), surrounding and repeated
  # spaces dropped, a word-start marker before each word, pieces within words.
  tok = Tokenizer(models.Unigram(vocab, unk_id=1, byte_fallback=False))
  tok.normalizer = normalizers.Sequence([
    normalizers.Precompiled(spec.precompiled_charsmap),
    normalizers.Strip(),
    normalizers.Replace(Regex(" {2,}"), " "),
  ])  # fmt: skip
  tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
  tok.decoder = decoders.Metaspace(prepend_scheme="always")
  tok.add_special_tokens(["</s>", "<unk>", "<pad>"])
  tok.save(str(path / "tokenizer.json"))
  _write_config(
    path, eos_token="</s>", unk_token="<unk>", pad_token="<pad>", source_lang="en",
    target_lang="es", tokenizer_class="MarianTokenizer",
  )  # fmt: skip
  return len(vocab)


def hf_config(family: str, vocab: int) -> tuple[str, dict]:
  """(architecture, the config.json fields its converter reads) of a tiny model."""
  bert_like = dict(
    hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
    intermediate_size=FFN, hidden_act="gelu",
  )  # fmt: skip
  if family == "gpt2":
    return "GPT2LMHeadModel", dict(
      vocab_size=vocab, n_embd=WIDTH, n_head=HEADS, n_layer=LAYERS, n_inner=FFN,
      n_positions=MAX_LEN, activation_function="gelu_new",
    )  # fmt: skip
  if family == "bert":
    return "BertForMaskedLM", dict(
      vocab_size=vocab, max_position_embeddings=MAX_LEN, type_vocab_size=2, **bert_like
    )
  if family == "llama":
    return "LlamaForCausalLM", dict(
      vocab_size=vocab, hidden_size=WIDTH, num_attention_heads=HEADS, num_key_value_heads=1,
      num_hidden_layers=LAYERS, intermediate_size=FFN, max_position_embeddings=MAX_LEN,
      hidden_act="silu", rope_theta=10_000.0, tie_word_embeddings=False,
    )  # fmt: skip
  if family == "mixtral":
    return "MixtralForCausalLM", dict(
      vocab_size=vocab, hidden_size=WIDTH, num_attention_heads=HEADS, num_key_value_heads=1,
      num_hidden_layers=LAYERS, intermediate_size=FFN, max_position_embeddings=MAX_LEN,
      hidden_act="silu", num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
      tie_word_embeddings=False,
    )  # fmt: skip
  if family == "gemma2":
    return "Gemma2ForCausalLM", dict(
      vocab_size=vocab, hidden_size=WIDTH, num_attention_heads=HEADS, num_key_value_heads=1,
      head_dim=16, num_hidden_layers=LAYERS, intermediate_size=FFN,
      max_position_embeddings=MAX_LEN, hidden_activation="gelu_pytorch_tanh",
      sliding_window=32, layer_types=["sliding_attention"] * LAYERS, query_pre_attn_scalar=16,
      attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True,
    )  # fmt: skip
  if family == "t5":
    return "T5ForConditionalGeneration", dict(
      vocab_size=vocab, d_model=WIDTH, num_heads=HEADS, d_kv=WIDTH // HEADS, d_ff=FFN,
      num_layers=LAYERS, num_decoder_layers=LAYERS, feed_forward_proj="relu",
      is_encoder_decoder=True, n_positions=MAX_LEN, tie_word_embeddings=True,
    )  # fmt: skip
  if family == "marian":  # Opus-MT's activation and scaling; EOS 0, PAD = start = V - 1
    return "MarianMTModel", dict(
      vocab_size=vocab, d_model=WIDTH, encoder_attention_heads=HEADS,
      decoder_attention_heads=HEADS, encoder_layers=LAYERS, decoder_layers=LAYERS,
      encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=MAX_LEN,
      activation_function="swish", scale_embedding=True, tie_word_embeddings=True,
      share_encoder_decoder_embeddings=True, is_encoder_decoder=True, eos_token_id=0,
      pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1,
    )  # fmt: skip
  if family == "vit":
    return "ViTForImageClassification", dict(
      image_size=32, patch_size=16, num_channels=1, qkv_bias=True,
      id2label={str(i): f"LABEL_{i}" for i in range(10)}, **bert_like,
    )  # fmt: skip
  if family == "dinov2":
    return "Dinov2ForImageClassification", dict(
      image_size=28, patch_size=14, num_channels=1, qkv_bias=True, mlp_ratio=FFN // WIDTH,
      layerscale_value=0.5, id2label={str(i): f"LABEL_{i}" for i in range(10)},
      hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS, hidden_act="gelu",
    )  # fmt: skip
  raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")


TOKENIZERS = {
  "gpt2": gpt2_tokenizer,
  "bert": bert_tokenizer,
  "llama": llama_tokenizer,
  "mixtral": llama_tokenizer,
  "gemma2": llama_tokenizer,
  "t5": t5_tokenizer,
  "marian": marian_tokenizer,
}


def make(family: str, path: str | Path, seed: int = 0, texts: list[str] | None = None) -> Path:
  """Writes a tiny random `family` directory (with its tokenizer) at `path`; returns it."""
  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  vocab = 0
  if family in TOKENIZERS:
    vocab = TOKENIZERS[family](path, texts if texts is not None else texts_for(family))
  architecture, fields = hf_config(family, vocab)
  converter = registry.get(architecture)
  config = ModelConfig(**converter.config_from_hf(fields))
  inputs = converter.init_inputs(config)
  params = jax.jit(build_model(config).init)(jax.random.PRNGKey(seed), *inputs)["params"]
  if family in PERTURBED:
    params = randomised_zeros(params, seed)
  convert.save(path, config, params, architecture)
  return path


def randomised_zeros(params, seed: int, scale: float = 0.02):
  """`params` with each all-zero tensor drawn from N(0, scale^2) instead: a zero head gives
  uniform logits, whose loss no other tensor changes."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  pairs = zip(keys, leaves, strict=True)
  return treedef.unflatten(
    [x if x.any() else scale * jax.random.normal(k, x.shape) for k, x in pairs]
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out", help="folder to write one directory per family into")
  parser.add_argument("families", nargs="*", default=FAMILIES, help=", ".join(FAMILIES))
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  for family in args.families:
    print(make(family, Path(args.out) / family, args.seed))


if __name__ == "__main__":
  main()
