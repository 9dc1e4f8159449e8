"""The stitch plan: AStitch's dominant-op analysis of a graph (view, stages, legal schemes, reuse candidates)."""
