"""Tuning: the tuning database, per-batch evaluation, optuna study/storage and the search loop."""
