"""GPT-2's byte-level BPE (`vocab.json` + `merges.txt`) behind the project's encode/decode interface, and as a corpus
tokenizer (`GPT2BPE`: batch encoding, `[*ids, eot]` framing, a fingerprint of the two files).

    tok = GPT2Tokenizer("../shared/data/gpt2")   # a local directory, or a hub name such as "gpt2"
    tok.encode("Hello world") == [15496, 995]

`<|endoftext|>` (50256) is both `eos_id` and `bos_id`, as in GPT-2. Text is always text: a literal
`<|endoftext|>` inside it is encoded as ordinary characters (unlike Hugging Face's fast GPT-2
tokenizer, which turns it into the EOT id), so only `encode_documents` and the caller place EOT,
and `decode(encode(text)) == text` for every text. `decode` drops EOT ids, as the SentencePiece
wrapper drops bos/eos. Needs only `tokenizers` (and `huggingface_hub` for hub names).
"""

import hashlib
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tapernorm_jax.hf.hub import resolve

VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"
FILES = (VOCAB_FILE, MERGES_FILE)
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


def files_digest(directory: Path) -> str:
  """SHA-256 over `vocab.json` then `merges.txt` in `directory` (each prefixed by its length)."""
  digest = hashlib.sha256()
  for name in FILES:
    content = (Path(directory) / name).read_bytes()
    digest.update(f"{name}:{len(content)}:".encode())
    digest.update(content)
  return digest.hexdigest()


class GPT2BPE(GPT2Tokenizer):
  """GPT-2's BPE with what prepared corpora need: `encode_batch`, `frame`, `save` and a content fingerprint."""

  def __init__(self, source: str | os.PathLike = "gpt2"):
    super().__init__(source)
    self.fingerprint: str = files_digest(self.directory)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (no EOT added), encoded in parallel by `tokenizers`."""
    return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

  def frame(self, ids: list[int]) -> list[int]:
    """One document's ids as they go into a token stream: `[*ids, eot]` (EOT after every document, no BOS)."""
    return [*ids, self.eos_id]
