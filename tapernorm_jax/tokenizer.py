"""A trained SentencePiece model behind the project's encode/decode interface (needs only `sentencepiece`)."""

from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm


MODEL_FILE = "tokenizer.model"


class SentencePiece:
  """encode, decode, bos_id, eos_id and vocab_size over a serialized SentencePiece model."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.bos_id: int = self.sp.bos_id()
    self.eos_id: int = self.sp.eos_id()
    self.vocab_size: int = self.sp.get_piece_size()

  @classmethod
  def from_file(cls, path: str | Path) -> "SentencePiece":
    """Loads a `.model` file."""
    return cls(Path(path).read_bytes())

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no bos/eos added)."""
    return self.sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`; bos/eos/unk ids decode to nothing."""
    return self.sp.decode([int(i) for i in ids])

  def save(self, directory: str | Path) -> None:
    """Writes the model as `tokenizer.model` into `directory`."""
    (Path(directory) / MODEL_FILE).write_bytes(self.model_proto)

  @classmethod
  def load(cls, directory: str | Path) -> "SentencePiece":
    """The model a `save` wrote into `directory`."""
    return cls.from_file(Path(directory) / MODEL_FILE)
