"""Opt-in CPU kernels for decoding: nothing in the model imports them; decoding applies them through one seam."""
