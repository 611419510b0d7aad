"""Shared defaults for every TinyStories variant (the paper's setup, docs/method.md §8); variant files set the norms.

The tables and builders live in the package (tapernorm_jax/defaults.py) so the library works from an installed
wheel; this module is the name the config files and user scripts import them by.
"""

from tapernorm_jax.defaults import SIZES, VARIANTS, get_config, override, parse_arg

__all__ = ["SIZES", "VARIANTS", "get_config", "override", "parse_arg"]
