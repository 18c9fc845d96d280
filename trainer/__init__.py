"""The driver: the ``fit()`` loop, validation, checkpoints, metrics, the Hydra entry point."""
