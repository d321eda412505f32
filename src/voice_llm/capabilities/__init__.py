"""The capabilities, each a package plugged in through voice_llm.core.registry.CAPABILITIES: speak (time to
first audio), agent, dial (and the lab's converse step), repeats, conversation (`voice-llm call`) and
load. Each exposes one CAPABILITY value in its __init__ and uses another only through its public face."""
