"""GPT-2's fixed BPE as a corpus tokenizer: batch encoding, `[*ids, eot]` framing, files saved with the data.

Wraps `tapernorm_jax.gpt2_tokenizer.GPT2Tokenizer` (a local directory with `vocab.json` and
`merges.txt`, or a hub name such as `gpt2`). Its `fingerprint` is the SHA-256 of the two files,
so a prepared cache names the exact vocabulary it was tokenized with.
"""

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from tapernorm_jax.gpt2_tokenizer import MERGES_FILE, VOCAB_FILE, GPT2Tokenizer

FILES = (VOCAB_FILE, MERGES_FILE)


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
