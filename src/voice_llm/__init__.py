"""voice-llm: when does the first token, and the first whole sentence, arrive from a local LLM server?"""

__version__ = "0.1.0"
