"""Reward verifiers (plugins) and the batch reward manager."""
