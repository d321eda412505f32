"""The line between a caller and a voice agent: the wire formats both sides speak (Twilio Media Streams' JSON
messages with 8 kHz mu-law, or binary frames of 16-bit PCM) and the caller's playout buffer (the phone's ear).

No sockets here: the dialer (voice_llm.capabilities.dial) and the agent (voice_llm.capabilities.agent) own their connections and clocks; this
package turns samples into messages and back, and decides what a phone would play when.
"""
