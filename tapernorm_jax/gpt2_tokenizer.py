"""GPT-2's byte-level BPE (`vocab.json` + `merges.txt`) behind the project's encode/decode interface.

    tok = GPT2Tokenizer("../shared/data/gpt2")   # a local directory, or a hub name such as "gpt2"
    tok.encode("Hello world") == [15496, 995]

`<|endoftext|>` (50256) is both `eos_id` and `bos_id`, as in GPT-2. Text is always text: a literal
`<|endoftext|>` inside it is encoded as ordinary characters (unlike Hugging Face's fast GPT-2
tokenizer, which turns it into the EOT id), so only `encode_documents` and the caller place EOT,
and `decode(encode(text)) == text` for every text. `decode` drops EOT ids, as the SentencePiece
wrapper drops bos/eos. Needs only `tokenizers` (and `huggingface_hub` for hub names).
"""

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tapernorm_jax.hf import resolve

VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"
EOT = "<|endoftext|>"


class GPT2Tokenizer:
  """encode, decode, encode_documents, bos_id = eos_id (`<|endoftext|>`) and vocab_size of GPT-2's BPE."""

  kind = "gpt2"

  def __init__(self, source: str | os.PathLike = "gpt2"):
    directory = resolve(source, (VOCAB_FILE, MERGES_FILE), "GPT2Tokenizer")
    self.directory: Path = directory
    self.tokenizer = Tokenizer(models.BPE.from_file(str(directory / VOCAB_FILE), str(directory / MERGES_FILE)))
    self.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    self.tokenizer.decoder = decoders.ByteLevel()
    eos_id = self.tokenizer.token_to_id(EOT)
    if eos_id is None:
      raise ValueError(f"{directory / VOCAB_FILE} has no {EOT} token; is it GPT-2's vocabulary?")
    self.eos_id: int = eos_id
    self.bos_id: int = eos_id
    self.vocab_size: int = self.tokenizer.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no EOT added; a literal `<|endoftext|>` is text)."""
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`; EOT ids decode to nothing."""
    return self.tokenizer.decode([int(i) for i in ids if int(i) != self.eos_id], skip_special_tokens=False)

  def save(self, directory: str | os.PathLike) -> None:
    """Copies `vocab.json` and `merges.txt` into `directory`, so it loads without the source."""
    for name in (VOCAB_FILE, MERGES_FILE):
      shutil.copyfile(self.directory / name, Path(directory) / name)

  @classmethod
  def load(cls, directory: str | os.PathLike) -> "GPT2Tokenizer":
    """The files a `save` wrote into `directory`."""
    return cls(directory)

  def encode_documents(self, texts: Iterable[str]) -> list[int]:
    """One stream of ids: every document's tokens followed by `<|endoftext|>`."""
    ids: list[int] = []
    for encoding in self.tokenizer.encode_batch(list(texts), add_special_tokens=False):
      ids += encoding.ids
      ids.append(self.eos_id)
    return ids
