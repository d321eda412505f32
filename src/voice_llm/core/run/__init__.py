"""Layer 2: the run folder: identity and metadata (meta), the writer's lock (lock), the run session every command that writes a run goes through."""
