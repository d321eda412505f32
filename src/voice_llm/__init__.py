"""voice-llm: when does the first token, and the first whole sentence, arrive from a local LLM server?"""

import os

__version__ = "0.1.0"

# onnxruntime (Piper's, Moonshine's and Silero-in-pipecat's runtime) writes a device id and a telemetry database under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime when it loads, unless ORT_DISABLE_TELEMETRY is set before its library
# is loaded (measured with onnxruntime 1.32.0: with it set, nothing is written). voice-llm writes only under OUT and
# the caches docs/quickstart.md names, so it is set here, before any engine is imported; the agent, Locust's workers and
# every other process voice-llm starts inherit it. A user who sets it to anything else keeps their value.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
