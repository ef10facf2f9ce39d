"""Device-side building blocks the ops share: block reductions, 16-byte vector loads and stores, L2 cache
hints."""
