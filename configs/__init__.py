"""The Hydra config tree: ``schema.py`` defines every key; the YAML files choose values.

``ppo_trainer.yaml`` is the root; each folder is a config group (one concern,
singular names) and ``experiment/`` holds named recipes.
"""

from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent)
"""Absolute path of this folder, for ``hydra.main(config_path=...)`` and ``initialize_config_dir``."""
