"""lm-evaluation-harness for the project's models (the optional `eval` extra): importing this registers the model type
`tapernorm` (harness/model.py); `python -m tapernorm_jax.harness` is lm-eval's own command line with it registered.
Without lm-eval installed the package still imports (so that its command line can say so in one line), and
`TaperNormLM` raises ImportError naming the extra."""

INSTALL = "pip install 'tapernorm-jax[eval]'"
missing = ""  # the module lm-eval needs that is not installed ("" where it is)

try:
  from tapernorm_jax.harness.model import TaperNormLM
except ModuleNotFoundError as e:
  if not (e.name or "").startswith("lm_eval"):
    raise
  missing = e.name


def __getattr__(name: str):
  """TaperNormLM where lm-eval is missing: an ImportError that names the extra."""
  if name == "TaperNormLM":
    raise ImportError(f"tapernorm_jax.harness.TaperNormLM needs lm-eval ({missing} is not installed): {INSTALL}")
  raise AttributeError(f"module 'tapernorm_jax.harness' has no attribute {name!r}")


__all__ = ["TaperNormLM"]
