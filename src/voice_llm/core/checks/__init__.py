"""Layer 3: checks re-derived from the saved files alone: the statuses (base) and the core checks of the brief's steps (core)."""
