"""``hybridflow --help`` as a user reads it: it says which command trains, and that command exists."""

import subprocess
import sys
from importlib import metadata


def test_help_names_the_training_command_and_it_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow", "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "train with hybridflow-train (Hydra overrides" in " ".join(out.split())  # argparse wraps lines
    [train] = [
        ep
        for ep in metadata.entry_points(group="console_scripts", name="hybridflow-train")
        if ep.dist is not None and ep.dist.name == "hybridflow"
    ]
    assert train.value == "hybridflow.trainer.main:main"
