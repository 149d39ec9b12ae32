"""Training: the loss, the learning-rate schedule, checkpoints, distributed setup and the loop."""
