"""Shared blocks every family is assembled from: attention, linear products of every weight kind,
rope kinds, norms, activations, MLP / MoE, MLA. They know nothing of checkpoints or tiers."""
