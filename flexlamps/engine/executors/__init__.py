"""Executors: run steps of a model on one machine, with weights in memory or offloaded across tiers."""
