"""The actor: log-probs and PPO updates (``ppo_actor``), wrapped by the actor worker."""
