"""The SPMD stage programs: actor, critic, reference and rollout engines, and model loading."""
