"""KV caches: dense (in memory), tiered (placed on gpu/cpu tiers, optionally compressed), paged (blocks);
latent (MLA models: latents, rotary keys and indexer keys)."""
