"""Other OpenAI-compatible servers voice-llm is tested against (llama-server itself is voice_llm.core.server.lifecycle)."""
