"""Layer 1: talking to an OpenAI-compatible server: the client (one connection rule, bounded answers) and the capability probe."""
