"""Active learning: designs, initial-state policies, learning tasks, the compiled loop and
metrics."""
