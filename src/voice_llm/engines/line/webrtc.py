"""WebRTC's audio as the dialer's call loop sees it (issue 40 item 2): the transport (voice_llm.capabilities.dial.webrtc) hands
it the frames decoded from the RTP that arrived, 16-bit PCM at 48 kHz, and sends the caller's frames as the same to
its Opus encoder. So its framing is raw PCM's (each frame numbered, nothing else): WebRTC has no marks and no clear
(a barge-in's silence comes when the agent stops sending), and no start or stop message (the peer connection's
offer and close are the call's start and hang-up)."""

from __future__ import annotations

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import register
from voice_llm.engines.line.pcm import PcmFraming


@register
class WebRtcFraming(PcmFraming):
    protocol = wire.WEBRTC
