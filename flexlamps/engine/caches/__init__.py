"""KV caches: dense (in memory), tiered (placed on gpu/cpu tiers, optionally compressed), paged (blocks)."""
