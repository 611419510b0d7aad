"""Local text files: chunked splitting, line ends, bad bytes, and clear errors for missing or empty files."""

import random

import pytest

from tapernorm_jax.data import text_files

SEP = "<|endoftext|>"


def test_split_documents_matches_str_split_for_any_chunking():
  for trial in range(300):
    rng = random.Random(trial)
    docs = ["".join(rng.choice("ab <|>\n") for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(0, 6))]
    text = SEP.join(docs)
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    assert list(text_files.split_documents(chunks, SEP)) == [d.strip() for d in text.split(SEP) if d.strip()]


def test_read_documents_small_chunks_crlf_and_bad_bytes(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, "CHUNK_BYTES", 3)
  path = tmp_path / "a.txt"
  path.write_bytes(b"one\r\ntwo \xc3\xa9\r\n<|endoftext|>\r\nthree \xff\xfe bytes\r\n<|endoftext|>\r\n")
  assert list(text_files.read_documents([path], SEP)) == ["one\ntwo é", "three \ufffd\ufffd bytes"]


def test_documents_never_span_files(tmp_path):
  (tmp_path / "a.txt").write_text("x1<|endoftext|>x2")
  (tmp_path / "b.txt").write_text("y1")
  paths = text_files.resolve(str(tmp_path / "*.txt"))
  assert [p.name for p in paths] == ["a.txt", "b.txt"]
  assert list(text_files.read_documents(paths, SEP)) == ["x1", "x2", "y1"]


def test_no_match_and_empty_files_are_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no file matches"):
    text_files.resolve(str(tmp_path / "*.txt"))
  (tmp_path / "empty.txt").write_text("")
  with pytest.raises(ValueError, match="empty"):
    text_files.resolve(str(tmp_path / "*.txt"))
  with pytest.raises(ValueError, match="no path"):
    text_files.resolve("")
