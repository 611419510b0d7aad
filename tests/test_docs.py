"""Every code example in README.md and docs/ runs: Python blocks are executed as written (in an empty directory, the
checkout importable), and every command is checked by the entry point itself with --check_only (its flags, config
files and overrides parse; a training run is not started). The few commands that cannot run here say why below."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from locations import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(python -m experiments\.[a-z_]+(?: [^`]*)?|\./dev\.sh train(?: [^`]*)?)`")
# Commands run elsewhere, not here: what installs (pip needs the network), and the suite itself.
RUN_ELSEWHERE = {
  "pip": "installs from the network (tests/test_notebook.py runs the install offline)",
  "./dev.sh test": "is this test suite (CI runs it)",
}


def blocks(language: str) -> list[tuple[str, str]]:
  """(page: line, code) of every `language` block in the pages."""
  found = []
  for page in PAGES:
    text = page.read_text()
    for match in BLOCK.finditer(text):
      if match[1] == language:
        found.append((f"{page.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}", match[2]))
  return found


def commands() -> list[tuple[str, str]]:
  """(where, command line) of every command in the bash blocks (comments stripped) and of every inline
  `python -m experiments.…` or `./dev.sh train …`, each command once."""
  found = {}
  for where, code in blocks("bash"):
    for line in code.splitlines():
      command = line.split("  #", 1)[0].strip()
      if command and not command.startswith("#"):
        found.setdefault(command, where)
  for page in PAGES:
    for command in INLINE.findall(page.read_text()):
      found.setdefault(command, str(page.relative_to(ROOT)))
  return [(where, command) for command, where in found.items()]


PYTHON = blocks("python")
COMMANDS = commands()


def test_the_pages_have_examples():
  assert len(PYTHON) >= 2 and len(COMMANDS) >= 10


@pytest.mark.parametrize("where,code", PYTHON, ids=[w for w, _ in PYTHON])
def test_python_example_runs(where, code, tmp_path):
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"


@pytest.mark.slow  # a process per command (about 5 s each); CI runs the slow tests too
@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w} {c[:40]}" for w, c in COMMANDS])
def test_command_is_valid(where, command):
  if reason := next((why for start, why in RUN_ELSEWHERE.items() if command.startswith(start)), None):
    pytest.skip(f"{command!r} {reason}")
  if "experiments.benchmark_peer" in command and importlib.util.find_spec("torch") is None:
    pytest.skip("the peer benchmark needs the peer extra (torch, transformers), not installed here")
  args = shlex.split(command)
  if args[:2] == ["./dev.sh", "train"]:  # ./dev.sh train runs experiments.tinystories with the CPU preset
    args = [sys.executable, "-m", "experiments.tinystories", *dev_train_arguments(), *args[2:]]
  assert args[:2] == ["python", "-m"] or args[0] == sys.executable, f"{where}: not a `python -m` command: {command}"
  args[0] = sys.executable
  done = subprocess.run([*args, "--check_only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and "--check_only" in done.stdout, f"{where}: {command}\n{done.stderr[-2000:]}"


def dev_train_arguments() -> list[str]:
  """The arguments `./dev.sh train` passes to experiments.tinystories."""
  line = next(line for line in (ROOT / "dev.sh").read_text().splitlines() if "experiments.tinystories" in line)
  return [arg for arg in shlex.split(line.split("experiments.tinystories", 1)[1]) if arg.startswith("--")]


def test_the_chip_table_in_the_tpu_page_is_the_package_s():
  from tapernorm_jax.aot import chips

  assert chips.table_markdown() in (ROOT / "docs" / "tpu.md").read_text()
