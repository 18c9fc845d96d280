"""The critic: value estimates and clipped value-loss updates (``ppo_critic``)."""
