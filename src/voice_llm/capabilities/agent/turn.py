"""The built-in agent's end of turn (``voice-llm agent --turn silence|smart``).

silence (the default): Silero and the core endpointer (voice_llm.engines.speech_in.vad.Endpointer) as they are: the turn ends
after ``--endpoint-ms`` of silence.

smart: pipecat's smart-turn v3.2 model (``LocalSmartTurnAnalyzerV3``: a Whisper-encoder classifier in ONNX whose
weights ship in the pipecat-ai wheel, the optional extra ``voice-llm[pipecat]``) judges the utterance after a short
silence: complete ends the turn at once; incomplete leaves it open until a longer fallback silence, unless speech
resumes first (then the utterance goes on, as after any pause). This is pipecat's own rule
(``TurnAnalyzerUserTurnStopStrategy`` over ``BaseSmartTurn``: the model runs at the VAD's stop, and on INCOMPLETE
``append_audio`` ends the turn once the silence reaches ``SmartTurnParams.stop_secs``).

Two parts, kept apart: :class:`TurnTaker` is the decision (pure: VAD probabilities and verdicts in, events out,
counted in frames of audio like the endpointer, no clock, no model), and :class:`SmartTurnModel` is the adapter to
pipecat's model, imported only when ``--turn smart`` is asked for (so the core never imports pipecat, and neither does
the agent unless asked).
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_llm.capabilities.agent.pipecat_extra import EXTRA_LINE, PIPECAT_PACKAGE
from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_in import vad as vadmod
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE

SILENCE, SMART = "silence", "smart"
MODES = (SILENCE, SMART)  # the --turn choices (agent.settings' TURNS)

# The silence after which the model is asked. pipecat's VAD stop for smart turn (VAD_STOP_SECS, 0.2 s: its turn
# strategy warns when the VAD's stop_secs differs, since its latency figures assume it; pipecat_agent uses it too).
# Measured here on the clinic lines over the Twilio line (8 kHz mu-law and back): the model's P(complete) is 0.82-0.99
# at 224 ms of silence after the VAD's speech end, but one line is at 0.77 at 128 ms and a line cut at 0 ms of
# trailing silence is judged incomplete: the model wants some silence after the last word.
SMART_SILENCE_MS = 200.0
# The silence that ends an utterance the model judged incomplete: pipecat's SmartTurnParams.stop_secs default (3 s),
# so the two agents' smart turns wait alike. A caller who stops after an "incomplete" line waits this long; a caller
# who pauses mid-sentence is not cut off before it.
SMART_FALLBACK_MS = 3000.0
# The model's input: the last 8 s of the utterance (pipecat's MAX_DURATION_SECONDS; _predict_endpoint keeps the last
# 8 s and pads a shorter one with zeros at the start).
MODEL_WINDOW_S = 8
# onnxruntime's intra-op threads for the model: pipecat's default (cpu_count=1). On this 2-core machine under load two
# threads measured slower (211 vs 160 ms a run), and the model runs while STT and the LLM may want the cores.
MODEL_THREADS = 1
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
MODEL_PACKAGE = "pipecat.audio.turn.smart_turn.data"
SMART_MODULE = "pipecat.audio.turn.smart_turn.local_smart_turn_v3"

CHECK = "turn_check"  # an event of smart mode: the pause has lasted SMART_SILENCE_MS, ask the model now

# What ended a turn.
RULE_SILENCE = "silence"  # --turn silence: --endpoint-ms of silence
RULE_COMPLETE = "model_complete"  # smart: the model judged the utterance complete after SMART_SILENCE_MS
RULE_FALLBACK = "fallback_silence"  # smart: incomplete (or no verdict yet), then SMART_FALLBACK_MS of silence


@dataclass(frozen=True)
class Verdict:
    """The model's answer on one utterance."""

    complete: bool
    probability: float  # P(complete), the model's sigmoid output; complete when above 0.5 (pipecat's rule)
    inference_ms: float  # the model run alone (features + ONNX), on its own thread


@dataclass(frozen=True)
class Decision:
    """What ended one turn (the agent's record, its log line and the turn span say it)."""

    mode: str
    rule: str
    silence_ms: float  # silence counted in audio when the turn ended (frames x frame_ms)
    verdict: Verdict | None = None  # smart: the model's verdict on the pause that ended the turn (None: none came)
    check_frame: int | None = None  # smart: the frame at which that verdict was asked for
    checks: int = 0  # smart: model runs on the pauses of this utterance since the last endpoint

    def as_dict(self) -> dict[str, Any]:
        verdict = self.verdict
        return {"mode": self.mode, "rule": self.rule, "silence_ms": round(self.silence_ms, 1),
                "checks": self.checks,
                "probability": round(verdict.probability, 4) if verdict is not None else None,
                "complete": verdict.complete if verdict is not None else None,
                "inference_ms": round(verdict.inference_ms, 1) if verdict is not None else None}

    def span_attributes(self) -> dict[str, Any]:
        """OpenTelemetry attributes of the turn span (voice_llm.capabilities.agent.otel): no None values (OTel drops them)."""
        found = {"voice_llm.turn.mode": self.mode, "voice_llm.turn.rule": self.rule,
                 "voice_llm.turn.silence_ms": round(self.silence_ms, 1)}
        if self.mode == SMART:
            found["voice_llm.smart_turn.checks"] = self.checks
        if self.verdict is not None:
            found["voice_llm.smart_turn.probability"] = round(self.verdict.probability, 4)
            found["voice_llm.smart_turn.complete"] = self.verdict.complete
            found["voice_llm.smart_turn.inference_ms"] = round(self.verdict.inference_ms, 1)
        return found


class TurnTaker:
    """The end-of-turn decision of one call. ``push`` takes each frame's VAD probability and returns the core
    endpointer's events (SPEECH_START, SPEECH_END, RESUMED, ENDPOINT), plus, in smart mode, a CHECK event when a
    pause reaches SMART_SILENCE_MS; the caller runs the model on the utterance so far and hands its verdict back to
    ``verdict`` with the CHECK's frame. A complete verdict on the pause still going on is the ENDPOINT; a verdict on a
    pause that has ended (speech resumed, or the fallback fired first) changes nothing. After each ENDPOINT
    ``decision`` says what decided it.

    Smart mode is the core endpointer with its endpoint at the fallback and its early pause at the short
    silence: the same frame counting, one pause at a time; nothing here knows the model or a clock. ``mode`` is one
    of MODES (the settings' rule: agent.settings)."""

    def __init__(self, mode: str = SILENCE, endpoint_ms: float = vadmod.DEFAULT_ENDPOINT_MS,
                 threshold: float = vadmod.DEFAULT_THRESHOLD, frame_ms: float = vadmod.FRAME_MS,
                 smart_silence_ms: float = SMART_SILENCE_MS, fallback_ms: float = SMART_FALLBACK_MS) -> None:
        self.mode = mode
        if mode == SMART:
            self.endpointer = vadmod.Endpointer(fallback_ms, smart_silence_ms, threshold, frame_ms)
        else:
            self.endpointer = vadmod.Endpointer(endpoint_ms, None, threshold, frame_ms)
        self.check_frame: int | None = None  # the current pause's CHECK (None: not asked yet, or no pause)
        self.verdicts: dict[int, Verdict | None] = {}  # the current pause's verdict, by its CHECK frame
        self.checks = 0
        self.decision: Decision | None = None

    def push(self, probability: float) -> list[vadmod.Event]:
        out: list[vadmod.Event] = []
        for event in self.endpointer.push(probability):
            if event.kind in (vadmod.SPEECH_END, vadmod.RESUMED):
                self.check_frame, self.verdicts = None, {}  # a new pause, or none: earlier verdicts are moot
            if event.kind == vadmod.EARLY:
                if self.mode == SMART:
                    self.check_frame = event.frame
                    self.checks += 1
                    out.append(vadmod.Event(CHECK, event.frame, event.silence_ms))
                continue
            if event.kind == vadmod.ENDPOINT:
                if self.mode == SMART:
                    verdict = self.verdicts.get(self.check_frame) if self.check_frame is not None else None
                    self._decided(Decision(SMART, RULE_FALLBACK, event.silence_ms, verdict, self.check_frame,
                                           self.checks))
                else:
                    self._decided(Decision(SILENCE, RULE_SILENCE, event.silence_ms))
            out.append(event)
        return out

    def verdict(self, check_frame: int, verdict: Verdict | None) -> list[vadmod.Event]:
        """The model's verdict (None: the model failed: as incomplete) on the CHECK at ``check_frame``: [ENDPOINT]
        when it ends the turn now, else []."""
        if check_frame != self.check_frame:
            return []  # a pause that is over
        self.verdicts[check_frame] = verdict
        if verdict is None or not verdict.complete:
            return []  # wait for the fallback silence, or for speech
        event = self.endpointer.endpoint_now()
        if event is None:
            return []
        self._decided(Decision(SMART, RULE_COMPLETE, event.silence_ms, verdict, check_frame, self.checks))
        return [event]

    def _decided(self, decision: Decision) -> None:
        self.decision = decision
        self.check_frame, self.verdicts, self.checks = None, {}, 0


def describe(mode: str, endpoint_ms: float, model: SmartTurnModel | None = None) -> dict[str, Any]:
    """The ready line's ``engines.turn`` part for the mode: what ends a turn, with its constants."""
    if mode == SILENCE:
        return {"mode": SILENCE, "endpoint_ms": endpoint_ms, "rule": f"{endpoint_ms:g} ms of silence"}
    return {"mode": SMART, "smart_silence_ms": SMART_SILENCE_MS, "fallback_ms": SMART_FALLBACK_MS,
            "endpoint_ms": None,
            "rule": f"smart-turn v3.2 after {SMART_SILENCE_MS:g} ms of silence: complete ends the turn, incomplete "
                    f"waits for {SMART_FALLBACK_MS:g} ms of silence or for speech",
            "model": model.info() if model is not None else None}


# --- the model (pipecat's, imported only here, only for --turn smart) -------------------------------------------


class SmartTurnModel:
    """pipecat's LocalSmartTurnAnalyzerV3, used as a pure function of the utterance.

    Called through ``_predict_endpoint(float32 audio at the analyzer's rate) -> {"prediction", "probability"}``: the
    hook every BaseSmartTurn subclass implements and BaseSmartTurn._process_speech_segment calls (pipecat-ai 1.14.0,
    the version the extra pins). The public path (``append_audio`` + ``analyze_end_of_turn``) is a per-stream state
    machine that finds the utterance's start by ``time.monotonic()`` stamps of each appended chunk and counts its own
    silence; it would have to be fed our frames a second time, and its own silence rule (stop_secs) would compete
    with the agent's. The hook is stateless (one ONNX session; onnxruntime's ``run`` is thread-safe), so one model
    serves every call. Load once at start; ``judge`` blocks (run it on a thread)."""

    def __init__(self, threads: int = MODEL_THREADS) -> None:
        try:
            from loguru import logger
            logger.disable("pipecat")  # pipecat logs its banner and DEBUG lines to stderr; the agent's log is ours
            module = importlib.import_module(SMART_MODULE)
        except ImportError as exc:
            missing = exc.name or str(exc)
            raise ConfigError(f"--turn smart needs pipecat's smart-turn model, and the pipecat extra is not installed "
                              f"({missing} is missing); install it: {EXTRA_LINE}") from None
        self.version = importlib.metadata.version(PIPECAT_PACKAGE)
        self.threads = threads
        # the weights in the wheel, named (pipecat's own lookup of the default goes through a deprecated API)
        weights = importlib.resources.files(MODEL_PACKAGE) / MODEL_FILE
        if not weights.is_file():
            raise ConfigError(f"--turn smart: {MODEL_FILE} is not in pipecat-ai {self.version}'s wheel: {EXTRA_LINE}")
        analyzer = module.LocalSmartTurnAnalyzerV3(smart_turn_model_path=str(weights), sample_rate=SAMPLE_RATE,
                                                   cpu_count=threads)
        analyzer.set_sample_rate(SAMPLE_RATE)
        if not callable(getattr(analyzer, "_predict_endpoint", None)):
            raise ConfigError(f"--turn smart: pipecat-ai {self.version} has no LocalSmartTurnAnalyzerV3."
                              f"_predict_endpoint (written for 1.14.0): {EXTRA_LINE}")
        self._analyzer = analyzer
        self.warm_ms = self.judge(np.zeros(SAMPLE_RATE, np.int16)).inference_ms  # the first run is the slow one

    def judge(self, samples: np.ndarray) -> Verdict:
        """The model's verdict on 16 kHz mono ``samples`` (int16, or float in [-1, 1]): the last MODEL_WINDOW_S."""
        window = samples[-MODEL_WINDOW_S * SAMPLE_RATE:]
        audio = window.astype(np.float32) / 32768.0 if window.dtype == np.int16 else window.astype(np.float32)
        start = time.perf_counter()
        result = self._analyzer._predict_endpoint(audio)
        inference_ms = (time.perf_counter() - start) * 1000.0
        probability = float(result["probability"])
        return Verdict(int(result["prediction"]) == 1, probability, inference_ms)

    def info(self) -> dict[str, Any]:
        return {"package": PIPECAT_PACKAGE, "version": self.version, "class": "LocalSmartTurnAnalyzerV3",
                "model_file": MODEL_FILE, "threads": self.threads, "window_s": MODEL_WINDOW_S,
                "complete_above": 0.5, "warm_ms": round(self.warm_ms, 1)}
