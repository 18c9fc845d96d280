"""hybridflow: reinforcement learning for language models on the HybridFlow design.

The top level is the architecture: ``core`` (runtime), ``plugins`` (hook
specifications and name resolution), ``estimators`` and ``rewards`` (plugins),
``workers`` and ``trainer`` (built on them). Import what you need from there;
this module stays light so ``hybridflow --help`` starts fast.
"""

__version__ = "0.1.0"  # the one place the version is set: setup.cfg reads it
