"""The model: the transformer, its config, its variables, norms, attention, parameter paths and sharding.

The package exports what most callers need; the modules hold the rest.
"""

from tapernorm_jax.model.config import ModelConfig
from tapernorm_jax.model.transformer import Transformer
from tapernorm_jax.model.variables import abstract_variables, check_matches, init, param_count

__all__ = ["ModelConfig", "Transformer", "abstract_variables", "check_matches", "init", "param_count"]
