"""Programs beside the RL driver: ``hybridflow compare`` (runs side by side), the Hydra multirun summary
(``sweep``), ``hybridflow export`` (a checkpoint to a Hugging Face directory) and ``hybridflow-train-rm``
(a Bradley-Terry reward model). They read what the driver writes; the driver imports none of them."""
