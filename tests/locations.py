"""Where tests find the checkout, the read-only shared data beside it (skipped where absent), and the fixtures."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: configs/, experiments/, tapernorm_jax/
SHARED_DATA = ROOT.parent / "shared" / "data"  # GPT-2's tokenizer files, a few real TinyStories stories
FIXTURES = ROOT / "tests" / "fixtures"
