"""`python -m tapernorm_jax.harness --model tapernorm --model_args path=RUN_OR_EXPORT_DIR,form=folded --tasks ...`:
lm-eval's command line (every flag of `lm_eval`) with the `tapernorm` model type registered, which the plain `lm_eval`
command cannot load (lm-eval 0.4 finds models only in its own package)."""

import sys


def main() -> None:
  """Registers the model type, then hands the arguments to lm-eval's own entry point."""
  try:
    import tapernorm_jax.harness  # noqa: F401 - registers `tapernorm`
    from lm_eval.__main__ import cli_evaluate
  except ImportError as e:
    sys.exit(f"error: {e.name} is not installed: pip install 'tapernorm-jax[eval]'")
  cli_evaluate()


if __name__ == "__main__":
  main()
