"""Device descriptions (presets, queried GPUs) and the occupancy calculator: the only source of hardware limits."""
