"""The schedule space: the Schedule value, its options and constraints (search_spaces/stitch.json)."""
