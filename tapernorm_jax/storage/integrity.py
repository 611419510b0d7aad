"""Sizes and SHA-256 hashes of a directory's files, kept in a small manifest written after them and checked before
they are read, so that a damaged file is named instead of loaded.

    record(directory)              writes DIR/manifest.json for every file under DIR (call it once they are written)
    check(directory, prefixes)     the first recorded file under `prefixes` that is missing or differs, in words
    seal(record) / unseal(record)  a JSON record that carries the SHA-256 of its own content (results.json)
    checked_line(record)           a JSON line that carries the CRC-32 of its own bytes (metrics.jsonl); read_lines
"""

import hashlib
import json
import os
import re
import zlib
from collections.abc import Sequence

from etils import epath

from tapernorm_jax.storage import run_files
from tapernorm_jax.errors import UserError

MANIFEST = "manifest.json"
VERSION = 1
SEAL = "sha256"  # the key a sealed record keeps its own hash under
CHECKED_LINE = re.compile(r'^(.*), "crc": "([0-9a-f]{8})"}$')  # a checked line: the record's JSON, then its CRC-32


class DamagedLinesError(UserError, ValueError):
  """A line of a checked JSON-lines file (metrics.jsonl) that is torn or does not match its checksum."""


def sha256(path: os.PathLike) -> str:
  """The SHA-256 of a file (a local path or an epath.Path, local or at a URL), hex."""
  digest = hashlib.sha256()
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _files(directory: epath.Path, prefix: str = "") -> list[str]:
  """Every file under `directory` but the manifest, as relative paths with '/'."""
  found = []
  for item in directory.iterdir():
    name = prefix + item.name
    if item.is_dir():
      found += _files(item, name + "/")
    elif name != MANIFEST:
      found.append(name)
  return sorted(found)


def record(directory: epath.Path) -> dict[str, dict]:
  """Writes DIR/manifest.json: {"version", "files": {relative path: {"size", "sha256"}}}; returns the files."""
  entries = {
    name: {"size": (directory / name).stat().length, "sha256": sha256(directory / name)} for name in _files(directory)
  }
  run_files.write_text_atomically(
    directory / MANIFEST,  # whole or absent under its name, killed anywhere
    json.dumps({"version": VERSION, "files": entries}, indent=1, sort_keys=True),
  )
  return entries


def check(directory: epath.Path, prefixes: Sequence[str] = ("",)) -> str:
  """'' when every file the manifest records under `prefixes` is there with its size and hash (or when there is no
  manifest: a directory written before they were kept), else what is wrong with the first one that is not."""
  path = directory / MANIFEST
  if not path.exists():
    return ""
  try:
    entries = json.loads(path.read_text())["files"]
  except (ValueError, KeyError, TypeError) as e:
    return f"{MANIFEST} cannot be read ({type(e).__name__}: {e})"
  for name, expected in sorted(entries.items()):
    if not name.startswith(tuple(prefixes)):
      continue
    file = directory / name
    if not file.exists():
      return f"{name} is missing"
    size = file.stat().length
    if size != expected["size"]:
      return f"{name} has {size:,} bytes, {MANIFEST} recorded {expected['size']:,}"
    if sha256(file) != expected["sha256"]:
      return f"{name} does not match the SHA-256 {MANIFEST} recorded"
  return ""


def _content_hash(record: dict) -> str:
  """The SHA-256 of a record's canonical JSON (sorted keys, no spaces), hex."""
  return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(record: dict) -> dict:
  """`record` with the SHA-256 of its content added under SEAL (write the result as JSON)."""
  return {**record, SEAL: _content_hash({k: v for k, v in record.items() if k != SEAL})}


def unseal(record: dict) -> tuple[dict, str]:
  """(the record without its seal, '' or what is wrong): a record written before seals were kept passes."""
  content = {k: v for k, v in record.items() if k != SEAL}
  if SEAL in record and record[SEAL] != _content_hash(content):
    return content, f"its content does not match the SHA-256 recorded in it ({SEAL})"
  return content, ""


def checked_line(record: dict) -> str:
  """`record` as one JSON line with `"crc"` appended as its last key: the CRC-32 of the line's bytes before it (the
  record's own JSON, closed with `}`); ends with a newline."""
  body = json.dumps(record)
  return f'{body[:-1]}, "crc": "{zlib.crc32(body.encode()):08x}"}}\n'


def line_body(line: str) -> str | None:
  """The record's JSON of a checked line whose CRC-32 matches, else None (torn, changed, or never checked)."""
  match = CHECKED_LINE.match(line.rstrip("\n"))
  if match is None:
    return None
  body = match.group(1) + "}"
  return body if f"{zlib.crc32(body.encode()):08x}" == match.group(2) else None


def carries_checksums(text: str) -> bool:
  """Whether lines of a JSON-lines file's `text` carry checksums (files written before they were kept do not)."""
  return ', "crc": "' in text


def read_line(line: str, checked: bool = True) -> dict | None:
  """The record of a line of a checked JSON-lines file, or None when it is torn or damaged; with `checked=False` (a
  file written before lines carried checksums) any line that parses to a record passes."""
  body = line_body(line)
  if body is not None:
    return json.loads(body)
  if checked:
    return None
  try:
    record = json.loads(line)
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def read_lines(path: epath.Path) -> tuple[list[dict], str]:
  """(the records of a checked JSON-lines file up to its first damaged line, '' or which line that is and where it
  stands); a file none of whose lines carry a checksum (written before they were kept) is read as it parses."""
  with path.open() as f:
    lines = [line for line in f if line.strip()]
  checked = carries_checksums("".join(lines))
  records: list[dict] = []
  for number, line in enumerate(lines, 1):
    record = read_line(line, checked)
    if record is None:
      where = f"after step {records[-1].get('step')}" if records else "the first record"
      state = "damaged (it does not match its checksum)" if line.endswith("\n") else "torn (its write never ended)"
      return records, f"line {number} of {len(lines)} ({where}) is {state}"
    records.append(record)
  return records, ""
