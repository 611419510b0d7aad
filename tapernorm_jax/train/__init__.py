"""Training: the run config and its checks, the trainer's jitted steps, the loop, checkpoints and metrics."""
