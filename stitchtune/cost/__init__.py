"""The cost model (time prediction and pruning), its calibration, and the AStitch heuristic schedule."""
