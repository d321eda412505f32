"""Layer 2: the managed llama-server: its flags (config), its build and model (provision), its lifecycle and state on disk, the second backend."""
