"""Shared defaults for every TinyStories variant (the paper's setup, docs/method.md §8); variant files set the norms.

The tables and builders live in the package (tapernorm_jax/taper/variants.py, tapernorm_jax/train/run_config.py)
so the library works from an installed wheel; this module is the name the config files and user scripts import
them by.
"""

from tapernorm_jax.taper.variants import SIZES, VARIANTS
from tapernorm_jax.train.run_config import get_config, override, parse_arg

__all__ = ["SIZES", "VARIANTS", "get_config", "override", "parse_arg"]
