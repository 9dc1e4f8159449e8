"""Lowering: (graph, plan, schedule, device) -> kernel IR program; shared machinery and one module per family."""
