"""Layer 1: what the lab says to the server: the brief's constants, prompts, the clinic knowledge base and the dialogues."""
