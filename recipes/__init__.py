"""Recipe steps as plugins: batch hooks the driver runs at fixed points of ``fit()``.

A recipe such as DAPO is an experiment YAML (``configs/experiment/dapo.yaml``)
plus hooks from here, selected by ``algorithm.batch_hooks``; ``fit()`` has no
line for any recipe. Each module is one hook, registered through the
``hybridflow`` entry-point group like the estimators.
"""
