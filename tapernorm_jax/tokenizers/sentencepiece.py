"""SentencePiece tokenizers: a trained model behind the project's encode/decode interface, and training one.

`SentencePiece` wraps any serialized model (needs only `sentencepiece`). `train` makes one from a
corpus's training documents: BPE with byte fallback, identity normalisation and `\\n` as a piece of
its own, so that `decode(encode(text)) == text` for any text without leading or trailing spaces.
Ids: 0 = unk, 1 = bos, 2 = eos, 3 = `\\n`. A trained `Tokenizer` saves `tokenizer.model` and
`tokenizer.json` (the settings); `load` checks those settings against the ones asked for.
"""

import dataclasses
import hashlib
import io
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from tapernorm_jax.errors import UserError

MODEL_FILE = "tokenizer.model"
SETTINGS_FILE = "tokenizer.json"
MAX_SENTENCE_BYTES = 1 << 20  # SentencePiece skips longer training sentences (documents here)
log = logging.getLogger(__name__)


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


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
  """Everything that determines a trained tokenizer besides its training text."""

  vocab_size: int
  model_type: str = "bpe"
  byte_fallback: bool = True
  character_coverage: float = 0.9995
  train_bytes: int = 100_000_000  # at most this much training text (the first documents) trains the model
  version: int = 1  # bump when the training recipe changes

  def to_dict(self) -> dict:
    """The settings as a JSON-ready dict."""
    return dataclasses.asdict(self)


class TokenizerMismatchError(UserError, ValueError):
  """A cached tokenizer was trained with other settings than the ones asked for."""


class Tokenizer(SentencePiece):
  """A trained SentencePiece model together with the settings it was trained with."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes, settings: TokenizerSettings):
    super().__init__(model_proto)
    self.settings = settings
    self.fingerprint: str = hashlib.sha256(model_proto).hexdigest()  # identifies the trained model

  def frame(self, ids: list[int]) -> list[int]:
    """One document's ids as they go into a token stream: `[bos, *ids, eos]`."""
    return [self.bos_id, *ids, self.eos_id]

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of each text, encoded on `num_threads` threads (-1: all cores)."""
    return self.sp.encode(list(texts), num_threads=num_threads)

  def save(self, directory: Path) -> None:
    """Writes the model and its settings into `directory`."""
    super().save(directory)
    (Path(directory) / SETTINGS_FILE).write_text(json.dumps(self.settings.to_dict(), indent=2, sort_keys=True) + "\n")


def load(directory: Path, expected: TokenizerSettings) -> Tokenizer:
  """The tokenizer saved in `directory`; a clear error if it was trained with settings other than `expected`."""
  directory = Path(directory)
  settings_path, model_path = directory / SETTINGS_FILE, directory / MODEL_FILE
  if not settings_path.is_file() or not model_path.is_file():
    raise FileNotFoundError(f"no tokenizer in {directory}: expected {MODEL_FILE} and {SETTINGS_FILE}")
  saved = json.loads(settings_path.read_text())
  if saved != expected.to_dict():
    diff = {k: (saved.get(k), v) for k, v in expected.to_dict().items() if saved.get(k) != v}
    diff |= {k: (v, None) for k, v in saved.items() if k not in diff and k not in expected.to_dict()}
    details = ", ".join(f"{k}: cached {a!r} vs requested {b!r}" for k, (a, b) in sorted(diff.items()))
    raise TokenizerMismatchError(
      f"the cached tokenizer in {directory} was trained with different settings ({details}); "
      f"delete {directory} to retrain it, or ask for the settings it was trained with"
    )
  tokenizer = Tokenizer(model_path.read_bytes(), expected)
  if tokenizer.vocab_size != expected.vocab_size:
    raise TokenizerMismatchError(
      f"the cached tokenizer in {directory} has {tokenizer.vocab_size} pieces, not {expected.vocab_size}; delete it"
    )
  return tokenizer


def take_bytes(documents: Iterable[str], budget: int, too_long: list[int] | None = None) -> Iterator[str]:
  """The first documents of `documents` whose UTF-8 sizes sum to at most `budget` (at least one); the sizes of those
  over MAX_SENTENCE_BYTES, which SentencePiece leaves out, are appended to `too_long`."""
  used = 0
  for doc in documents:
    size = len(doc.encode("utf-8"))
    if used and used + size > budget:
      return
    used += size
    if size > MAX_SENTENCE_BYTES and too_long is not None:
      too_long.append(size)
    yield doc


def train(documents: Iterable[str], settings: TokenizerSettings, corpus_name: str = "the corpus") -> Tokenizer:
  """Trains a tokenizer on `documents` (a document is one SentencePiece sentence)."""
  model, too_long = io.BytesIO(), []
  texts = take_bytes(documents, settings.train_bytes, too_long)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=texts,
      model_writer=model,
      model_type=settings.model_type,
      vocab_size=settings.vocab_size,
      byte_fallback=settings.byte_fallback,
      character_coverage=settings.character_coverage,
      normalization_rule_name="identity",
      remove_extra_whitespaces=False,
      user_defined_symbols=["\n"],
      max_sentence_length=MAX_SENTENCE_BYTES,
      unk_surface="\u2047",
      num_threads=2,
      minloglevel=2,
    )
  except RuntimeError as e:
    if match := re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", str(e)):
      raise ValueError(
        f"{corpus_name} is too small for a {match[1]}-piece tokenizer: its training text supports at most "
        f"{match[2]} pieces; lower data.vocab_size (and model.V) or use more training text"
      ) from None
    if match := re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(e)):
      raise ValueError(
        f"{corpus_name} has {match[2]} distinct characters (and special pieces), more than a {match[1]}-piece "
        f"tokenizer holds; raise data.vocab_size (and model.V) to at least {match[2]}"
      ) from None
    if "sentences_.empty()" in str(e):
      raise ValueError(f"{corpus_name} has no training text to train a tokenizer on") from e
    raise
  if too_long:
    log.warning(
      "%s: %d document(s) longer than %d bytes (the longest %d) were left out of tokenizer training, as "
      "SentencePiece skips them; they are still tokenized and trained on",
      corpus_name,
      len(too_long),
      MAX_SENTENCE_BYTES,
      max(too_long),
    )
  return Tokenizer(model.getvalue(), settings)
