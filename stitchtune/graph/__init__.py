"""graph.json: format, validation and limits, the immutable graph values and workload keys, the op table, the float64 reference."""
