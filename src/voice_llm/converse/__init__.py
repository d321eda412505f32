"""The caller's turn: a call fed in real time through VAD, STT, the LLM and the speak pipeline."""
