"""Rows of ``bench/downstream.py``: one module per task, each with ``run(out_dir, shared, quick) -> dict``."""
