"""Checked JSON lines (metrics.jsonl): every change to a line is found, and a file is read up to its first damage."""

import json
import zlib

from etils import epath

from tapernorm_jax.storage import integrity

RECORD = {"step": 7, "loss": 3.141592653589793, "gate": 0.5, "c/final": "nan", "eval/val": 2.5e-05}


def test_a_checked_line_reads_back_as_its_record_and_its_crc_is_zlibs():
  line = integrity.checked_line(RECORD)
  assert line.endswith("\n") and line.count("\n") == 1
  assert integrity.read_line(line) == RECORD
  parsed = json.loads(line)  # still plain JSON: any reader sees the record and a "crc" key
  assert int(parsed.pop("crc"), 16) == zlib.crc32(json.dumps(RECORD).encode()) and parsed == RECORD


def test_every_single_byte_change_to_a_checked_line_is_found():
  line = integrity.checked_line(RECORD).rstrip("\n")
  changed = 0
  for i, ch in enumerate(line):
    for other in {"0", "1", "9", "a", "f", "x", " ", '"'} - {ch}:
      assert integrity.read_line(line[:i] + other + line[i + 1 :] + "\n") is None, (i, other)
      changed += 1
  assert changed > 7 * len(line)


def test_a_file_is_read_up_to_its_first_damaged_or_torn_line(tmp_path):
  lines = [integrity.checked_line({"step": s, "loss": 1.0 / (s + 1)}) for s in range(5)]
  path = tmp_path / "metrics.jsonl"
  damaged = lines[2].replace('"loss": 0.3333', '"loss": 0.3334')  # still parses
  path.write_text("".join(lines[:2] + [damaged] + lines[3:]))
  records, damage = integrity.read_lines(epath.Path(path))
  assert [r["step"] for r in records] == [0, 1]
  assert damage == "line 3 of 5 (after step 1) is damaged (it does not match its checksum)"
  path.write_text("".join(lines[:4]) + lines[4][:20])  # a write cut short
  records, damage = integrity.read_lines(epath.Path(path))
  assert len(records) == 4 and damage == "line 5 of 5 (after step 3) is torn (its write never ended)"


def test_a_file_written_before_lines_carried_checksums_is_read_as_it_parses(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(3)) + '{"step": 3, "lo')
  records, damage = integrity.read_lines(epath.Path(path))
  assert records == [{"step": 0}, {"step": 1}, {"step": 2}] and damage.startswith("line 4 of 4 (after step 2) is torn")
