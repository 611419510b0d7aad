"""lm-evaluation-harness for the project's models (the optional `eval` extra): importing this registers the model type
`tapernorm` (harness/model.py); `python -m tapernorm_jax.harness` is lm-eval's own command line with it registered."""

from tapernorm_jax.harness.model import TaperNormLM

__all__ = ["TaperNormLM"]
