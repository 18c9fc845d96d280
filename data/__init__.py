"""Datasets in the training schema: preparation (:mod:`.preprocess`), validated
loading (:mod:`.loading`) and the synthetic task (:mod:`.synthetic`)."""
