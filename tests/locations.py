"""Where tests find the checkout, the read-only shared data beside it (skipped where absent), and the fixtures; and
how a test runs code as from an installed wheel, with the checkout's own packages out of reach."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: configs/, experiments/, tapernorm_jax/
SHARED_DATA = ROOT.parent / "shared" / "data"  # GPT-2's tokenizer files, a few real TinyStories stories
FIXTURES = ROOT / "tests" / "fixtures"
# Prepended to a script: every import of configs/ or experiments/ then fails (a None entry in sys.modules).
WITHOUT_CHECKOUT = "import sys; sys.modules['configs'] = sys.modules['experiments'] = None\n"


def run_without_checkout(
  script: str, cwd: str | Path, python: str = sys.executable, timeout: int = 300, **kwargs
) -> subprocess.CompletedProcess:
  """`python -c script` in `cwd` with configs/ and experiments/ unimportable; asserts that it exits 0."""
  done = subprocess.run(
    [python, "-c", WITHOUT_CHECKOUT + script], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done
