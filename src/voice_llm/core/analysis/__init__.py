"""Layer 3: numbers derived from a run folder: metrics, key numbers, load noise, comparison of runs."""
