"""Training: schedules, optimizer, losses, train state and step, checkpoints, metric writers.

Import the submodules directly, e.g. `from transformer.train import schedules`.
"""
