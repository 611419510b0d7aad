"""`data.tokenizer`: a SentencePiece model trained on the corpus, or GPT-2's fixed BPE from `data.tokenizer_dir`.

A choice knows its cache key (what makes two prepared corpora share a tokenizer), how to
obtain the tokenizer for a corpus (train it, or load the fixed files) and how to load it back
from a prepared directory. The SentencePiece key is its settings, exactly as before this
choice existed, so existing caches stay valid; the GPT-2 key is `kind` plus the SHA-256 of
`vocab.json` + `merges.txt`.
"""

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from tapernorm_jax.data import corpora
from tapernorm_jax.tokenizers import sentencepiece as sentencepiece_lib

KINDS = ("sentencepiece", "gpt2")


class CorpusTokenizer(Protocol):
  """What prepared corpora, the eval sets and the generate script use of a tokenizer."""

  kind: str
  bos_id: int
  eos_id: int
  vocab_size: int
  fingerprint: str  # a hash of the tokenizer's files: equal fingerprints mean equal tokenization

  def encode(self, text: str) -> list[int]: ...
  def decode(self, ids: Iterable[int]) -> str: ...
  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
  def frame(self, ids: list[int]) -> list[int]: ...
  def save(self, directory: Path) -> None: ...


@dataclasses.dataclass(frozen=True)
class SentencePieceChoice:
  """A SentencePiece model trained on the corpus's training documents with `settings`."""

  settings: sentencepiece_lib.TokenizerSettings

  @property
  def key(self) -> dict:
    """The cache key part for the tokenizer (unchanged from before `data.tokenizer` existed)."""
    return self.settings.to_dict()

  @property
  def slug(self) -> str:
    """Short tag in the cache directory name."""
    return f"v{self.settings.vocab_size}"

  def make(self, corpus: corpora.Corpus) -> CorpusTokenizer:
    """Trains the tokenizer on `corpus`'s training documents."""
    return sentencepiece_lib.train(corpus.documents("train"), self.settings, corpus.name)

  def load(self, directory: Path) -> CorpusTokenizer:
    """The tokenizer saved in a prepared directory (an error if trained with other settings)."""
    return sentencepiece_lib.load(directory, self.settings)


@dataclasses.dataclass(frozen=True)
class GPT2Choice:
  """GPT-2's fixed BPE, already loaded from `source` (a directory or hub name)."""

  source: str
  tokenizer: Any  # gpt2_bpe.GPT2BPE; imported lazily (it pulls in `tokenizers` and the hub client)

  @property
  def key(self) -> dict:
    """The cache key part for the tokenizer: its kind and the hash of its files."""
    return dict(kind="gpt2", files_sha256=self.tokenizer.fingerprint)

  @property
  def slug(self) -> str:
    """Short tag in the cache directory name."""
    return "gpt2"

  def make(self, corpus: corpora.Corpus) -> CorpusTokenizer:
    """The fixed tokenizer (nothing to train)."""
    return self.tokenizer

  def load(self, directory: Path) -> CorpusTokenizer:
    """The copy of the files in a prepared directory; an error if they are not the ones asked for."""
    from tapernorm_jax.tokenizers import gpt2_bpe

    tokenizer = gpt2_bpe.GPT2BPE(directory)
    if tokenizer.fingerprint != self.tokenizer.fingerprint:
      raise sentencepiece_lib.TokenizerMismatchError(
        f"the GPT-2 tokenizer files in {directory} (sha256 {tokenizer.fingerprint[:12]}) differ from those of "
        f"data.tokenizer_dir={self.source!r} (sha256 {self.tokenizer.fingerprint[:12]}); delete {directory}"
      )
    return tokenizer


TokenizerChoice = SentencePieceChoice | GPT2Choice


def gpt2(source: str, vocab_size: int) -> GPT2Choice:
  """GPT-2's BPE from `source`; an error naming both fields unless `vocab_size` is its vocabulary size."""
  from tapernorm_jax.tokenizers import gpt2_bpe  # only when asked for

  if not source:
    raise ValueError(
      "data.tokenizer='gpt2' needs data.tokenizer_dir: a directory with vocab.json and merges.txt, "
      "or a hub name such as 'gpt2'"
    )
  from tapernorm_jax.hf.hub import HubUnavailableError

  try:
    tokenizer = gpt2_bpe.GPT2BPE(source)
  except (FileNotFoundError, HubUnavailableError) as e:  # keeps the type; adds the config field and its fix
    raise type(e)(f"data.tokenizer_dir={source!r}: {e}. In a config: --config.data.tokenizer_dir=DIR") from e
  if vocab_size != tokenizer.vocab_size:
    raise ValueError(
      f"data.vocab_size={vocab_size} does not match data.tokenizer='gpt2' (data.tokenizer_dir={source!r}), which "
      f"has {tokenizer.vocab_size} ids; set data.vocab_size (and model.V) to {tokenizer.vocab_size}"
    )
  return GPT2Choice(source=str(source), tokenizer=tokenizer)


def from_config(cfg: Any, vocab_size: int) -> TokenizerChoice:
  """The tokenizer `cfg.tokenizer` names, for a vocabulary of `vocab_size` ids."""
  kind = corpora.setting(cfg, "tokenizer")
  if kind == "sentencepiece":
    return SentencePieceChoice(
      sentencepiece_lib.TokenizerSettings(
        vocab_size=vocab_size,
        model_type=corpora.setting(cfg, "tokenizer_model"),
        train_bytes=int(corpora.setting(cfg, "tokenizer_train_bytes")),
      )
    )
  if kind == "gpt2":
    return gpt2(str(corpora.setting(cfg, "tokenizer_dir")), vocab_size)
  raise ValueError(f"data.tokenizer must be one of {KINDS}, got {kind!r}")
