"""Plain local text files as a corpus: a path or glob, documents split on a separator.

Files are read in chunks (a 2 GB file never sits in memory at once), decoded as UTF-8 with
every byte that is not valid UTF-8 replaced by U+FFFD (a warning per file gives the count),
and `\\r\\n` line ends are normalised to `\\n`. Each document is stripped of surrounding
whitespace; empty documents are dropped.
"""

import codecs
import glob
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

CHUNK_BYTES = 1 << 20
BAD_BYTE = re.compile("[\udc80-\udcff]")  # how `surrogateescape` decodes a byte that is not valid UTF-8
log = logging.getLogger(__name__)
_WARNED: set[tuple[str, int]] = set()  # files whose replaced bytes were already reported


def resolve(pattern: str, what: str = "text files") -> list[Path]:
  """The sorted files that `pattern` (a path or glob, `~` expanded) names; a clear error if none or all empty."""
  if not pattern:
    raise ValueError(f"no path given for the {what}")
  expanded = os.path.expanduser(pattern)
  paths = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
  if not paths:
    shown = f"{pattern!r}" + (f" (expanded to {expanded!r})" if expanded != pattern else "")
    raise FileNotFoundError(f"{what}: no file matches {shown}")
  empty = [str(p) for p in paths if p.stat().st_size == 0]
  if empty:
    raise ValueError(f"{what}: these files are empty: {', '.join(empty)}")
  return paths


def split_documents(chunks: Iterable[str], separator: str) -> Iterator[str]:
  """Splits a stream of text chunks on `separator`, yielding stripped, non-empty documents."""
  if not separator:
    raise ValueError("the document separator must not be empty")
  pieces: list[str] = []  # the current document so far, none of it part of a separator
  tail = ""  # text not yet searched in full: it may hold the start of a separator
  for chunk in chunks:
    *done, tail = (tail + chunk).split(separator)
    if done:
      done[0] = "".join(pieces) + done[0]
      pieces = []
      yield from filter(None, (doc.strip() for doc in done))
    keep = len(tail) - len(separator) + 1  # a long document moves to `pieces`, so no text is searched twice
    if keep > 0:
      pieces.append(tail[:keep])
      tail = tail[keep:]
  if doc := ("".join(pieces) + tail).strip():
    yield doc


def read_chunks(path: Path) -> Iterator[str]:
  """The text of `path` in chunks: UTF-8, each invalid byte replaced by U+FFFD (counted, and warned about once at
  the end of the file), `\\r\\n` and `\\r` turned into `\\n`."""
  decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
  carry, replaced = "", 0
  with open(path, "rb") as f:
    while block := f.read(CHUNK_BYTES):
      text, bad = BAD_BYTE.subn("\ufffd", carry + decoder.decode(block))
      replaced += bad
      # Hold back a trailing `\r` so a `\r\n` split across two blocks becomes one newline.
      text, carry = (text[:-1], "\r") if text.endswith("\r") else (text, "")
      yield text.replace("\r\n", "\n").replace("\r", "\n")
  text, bad = BAD_BYTE.subn("\ufffd", carry + decoder.decode(b"", final=True))
  replaced += bad
  yield text.replace("\r", "\n")
  key = (str(Path(path).resolve()), os.stat(path).st_mtime_ns)
  if replaced and key not in _WARNED:  # once per file, though a corpus is read twice (tokenizer, then tokens)
    _WARNED.add(key)
    log.warning(
      "%s: %d byte(s) are not valid UTF-8; each was replaced by U+FFFD. Re-encode the file as UTF-8 to keep that text.",
      path,
      replaced,
    )


def read_documents(paths: Iterable[Path], separator: str) -> Iterator[str]:
  """The documents of `paths`, in order; a document never spans two files."""
  for path in paths:
    yield from split_documents(read_chunks(path), separator)


def file_fingerprint(paths: Iterable[Path]) -> list[list]:
  """(path, size, mtime) of each file: a changed file gives a new cache key."""
  return [[str(p.resolve()), p.stat().st_size, int(p.stat().st_mtime)] for p in paths]
