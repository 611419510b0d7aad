"""The method: the gate schedule, calibration of c and γ̃, the scale losses, TaperNorm and FakeLN, the fold, and the
paper's sizes and variants. The norm layer they drive is `tapernorm_jax/model/norms.py`."""
