"""Datasets in the training schema: preparation (:mod:`.preprocess`), validated
loading (:mod:`.loading`) and the synthetic tasks (:mod:`.synthetic`, :mod:`.synthetic_tool`)."""

from hybridflow.data.synthetic import generate_synthetic
from hybridflow.data.synthetic_tool import generate_tool_task

SYNTHETIC_GENERATORS = {
    "arithmetic": ("", generate_synthetic),
    "tool": ("tool-", generate_tool_task),
}
"""``data.synthetic_task`` -> (prefix of its directory under ``data.synthetic_dir``, the generator)."""
