"""Speech to text with Moonshine tiny (English) on onnxruntime: the encoder and the merged decoder that ship as
``.ort`` files inside the ``moonshine-voice==0.1.0`` wheel (MIT weights; from 0.1.1 on the wheel no longer carries
them), driven directly, greedy. Nothing comes from a hub: the package is found without importing it (its own Python
imports sounddevice and downloads models on use), and only its asset files are read.

Why Moonshine and not Whisper at the endpoint (decision 0005; ../shared/notes/speech-in.md, "Moonshine tiny vs tiny.en"): Whisper's
encoder always encodes a 30 s window, so a 2 s caller line costs ~670 ms whatever was said; Moonshine's encoder takes
the utterance as it is (cost grows with its length), ~100-120 ms for a 1.4-3.2 s telephone-band line on one thread,
with the same word errors on the clinic lines.

The tokens are turned into text with the vocabulary that ships beside the weights (``tokenizer.bin``): 32,768
length-prefixed byte strings, id order, the ids of the Hugging Face ``tokenizer.json`` of
``useful-moonshine-onnx==20251121`` (a SentencePiece-style BPE: ``▁`` for a space, ``<0xNN>`` byte fallback). Checked
here once against that tokenizer.json (2026-12-04): all 32,768 pieces equal but one (id 31353, U+2028, stored empty);
decoding follows its decoder chain: pieces' bytes joined, ``▁`` -> space, UTF-8, one leading space stripped.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE
from voice_llm.engines.speech_in.stt_common import STTError, STTUnavailableError, sha256_of

PACKAGE = "moonshine-voice"
PACKAGE_VERSION = "0.1.0"
MODEL = "moonshine-tiny-en"
ASSETS = ("assets", "tiny-en")
ENCODER_FILE = "encoder_model.ort"
DECODER_FILE = "decoder_model_merged.ort"
TOKENIZER_FILE = "tokenizer.bin"
# Moonshine tiny's decoder: 6 layers, 8 key/value heads of 36 (the merged decoder's past_key_values.* inputs).
LAYERS, HEADS, HEAD_DIM = 6, 8, 36
START_TOKEN, END_TOKEN = 1, 2
SPECIAL_IDS = frozenset({0, 1, 2})  # <unk>, <s>, </s>; the <<ST_n>> added tokens are skipped by their form
# The runaway-decode cap: a greedy decoder on noise or a cut word can loop on one token; English speech is at most
# ~6.5 tokens a second (../shared/notes/speech-in.md), so a transcript longer than that is a loop, not speech.
TOKENS_PER_SECOND_CAP = 6.5
TOKENS_EXTRA = 4
# One onnxruntime thread is the default: measured here, 1 thread 99-119 ms median a line, 2 threads 154-199 ms
# (the cores are shared with the VAD, the LLM server and Piper; a second intra-op thread waits on them).
DEFAULT_THREADS = 1
MIN_SAMPLES = SAMPLE_RATE // 10  # the encoder's convolutions need ~8 ms; below 0.1 s there are no words to find


def package_dir() -> Path:
    """The installed moonshine_voice folder, found without importing the package."""
    spec = importlib.util.find_spec("moonshine_voice")
    if spec is None or not spec.submodule_search_locations:
        raise STTUnavailableError(f"Moonshine is not installed: pip install '{PACKAGE}=={PACKAGE_VERSION}' "
                                  "(or use --stt faster-whisper / none)")
    return Path(list(spec.submodule_search_locations)[0])


def model_dir() -> Path:
    folder = package_dir().joinpath(*ASSETS)
    missing = [name for name in (ENCODER_FILE, DECODER_FILE, TOKENIZER_FILE) if not (folder / name).is_file()]
    if missing:
        raise STTUnavailableError(f"Moonshine tiny's {', '.join(missing)} are not in {folder}: only "
                                  f"'{PACKAGE}=={PACKAGE_VERSION}' ships them (pip install it)")
    return folder


def read_vocabulary(path: Path) -> list[bytes]:
    """``tokenizer.bin``: each piece a length byte and that many bytes (a length of 128 or more takes a second byte
    for its high bits); the pieces in id order."""
    data = path.read_bytes()
    pieces: list[bytes] = []
    at = 0
    while at < len(data):
        size = data[at]
        at += 1
        if size >= 0x80:
            if at >= len(data):
                raise STTError(f"{path}: truncated at piece {len(pieces)}")
            size = (size & 0x7F) | (data[at] << 7)
            at += 1
        if at + size > len(data):
            raise STTError(f"{path}: truncated at piece {len(pieces)}")
        pieces.append(data[at:at + size])
        at += size
    return pieces


def decode_tokens(pieces: list[bytes], tokens: list[int]) -> str:
    """The text of ``tokens`` as the tokenizer.json's decoder chain makes it (Replace ▁ -> space, ByteFallback,
    Fuse, Strip one leading space), special tokens skipped."""
    out = bytearray()
    for token in tokens:
        if token in SPECIAL_IDS or not 0 <= token < len(pieces):
            continue
        piece = pieces[token]
        if piece.startswith(b"<<ST_") and piece.endswith(b">>"):
            continue
        out += piece
    text = out.decode("utf-8", errors="replace").replace("\u2581", " ")
    return text[1:] if text.startswith(" ") else text


def token_cap(samples: int) -> int:
    return int(math.ceil(TOKENS_PER_SECOND_CAP * samples / SAMPLE_RATE)) + TOKENS_EXTRA


class DecodeCancelled(Exception):
    """A decode whose ``cancelled()`` turned true between two decoder steps (a speculative decode of a pause the
    caller spoke on through): its transcript would be dropped anyway, so its remaining steps are not run."""


class MoonshineTranscriber:
    """Moonshine tiny, CPU, greedy; one encoder pass on the whole utterance, then one decoder step a token with the
    key/value cache (the merged decoder's ``use_cache_branch``)."""

    name = "moonshine"

    def __init__(self, threads: int = DEFAULT_THREADS) -> None:
        if threads < 1:
            raise ConfigError(f"--stt-threads must be at least 1, not {threads}")
        self.threads = threads
        self.model_dir = model_dir()
        try:
            import onnxruntime
        except ImportError as exc:
            raise STTUnavailableError("onnxruntime is not installed (pip install onnxruntime)") from exc
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initializers are onnxruntime's, not the caller's
        try:
            self._encoder = onnxruntime.InferenceSession(str(self.model_dir / ENCODER_FILE), options,
                                                         providers=["CPUExecutionProvider"])
            self._decoder = onnxruntime.InferenceSession(str(self.model_dir / DECODER_FILE), options,
                                                         providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own exception types (InvalidGraph, Fail, ...)
            raise STTError(f"cannot load Moonshine from {self.model_dir}: {str(exc)[:200]}") from exc
        self._pieces = read_vocabulary(self.model_dir / TOKENIZER_FILE)
        self._decoder_inputs = {i.name for i in self._decoder.get_inputs()}
        self.capped = 0  # decodes stopped by the runaway cap (a loop, not speech)
        self.cancelled = 0  # decodes given up between two steps (a dropped speculation)
        self.last_tokens: list[int] = []
        # The first run of each session allocates its arenas: pay for it here, on a second of quiet noise.
        rng = np.random.default_rng(0)
        self._decode((rng.standard_normal(SAMPLE_RATE) * 0.001).astype(np.float32), None)
        self.capped = 0

    def _decode(self, audio: np.ndarray, cancelled: Callable[[], bool] | None) -> str:
        if len(audio) < MIN_SAMPLES:
            audio = np.pad(audio, (0, MIN_SAMPLES - len(audio)))
        values = np.ascontiguousarray(audio[None, :], dtype=np.float32)
        mask = np.ones_like(values, dtype=np.int64)
        hidden = self._encoder.run(None, {"input_values": values, "attention_mask": mask})[0]
        empty = np.zeros((1, HEADS, 0, HEAD_DIM), dtype=np.float32)
        past = {f"past_key_values.{layer}.{side}.{kind}": empty
                for layer in range(LAYERS) for side in ("decoder", "encoder") for kind in ("key", "value")}
        tokens: list[int] = []
        next_ids = np.array([[START_TOKEN]], dtype=np.int64)
        cap = token_cap(len(audio))
        for step in range(cap):
            if cancelled is not None and step and cancelled():
                self.cancelled += 1
                raise DecodeCancelled
            inputs: dict[str, Any] = {"input_ids": next_ids, "encoder_hidden_states": hidden,
                                      "use_cache_branch": np.array([step > 0]), **past}
            if "encoder_attention_mask" in self._decoder_inputs:
                inputs["encoder_attention_mask"] = mask
            logits, *present = self._decoder.run(None, inputs)
            token = int(logits[0, -1].argmax())
            if token == END_TOKEN:
                break
            tokens.append(token)
            next_ids = np.array([[token]], dtype=np.int64)
            # the decoder's own keys grow every step; the encoder's (cross-attention) are computed on the first
            # step only: on the cache branch the model passes them through
            for name, value in zip(past, present):
                if step == 0 or ".decoder." in name:
                    past[name] = value
        else:
            self.capped += 1
        self.last_tokens = tokens
        return decode_tokens(self._pieces, tokens).strip()

    def transcribe(self, samples: np.ndarray, script: str, cancelled: Callable[[], bool] | None = None) -> str:
        """The text of ``samples`` (16 kHz mono int16). ``cancelled``, when given, is asked between decoder steps;
        true raises :class:`DecodeCancelled`."""
        try:
            return self._decode(samples.astype(np.float32) / 32768.0, cancelled)
        except DecodeCancelled:
            raise
        except Exception as exc:
            raise STTError(f"Moonshine failed: {exc.__class__.__name__}: {str(exc)[:200]}") from exc

    def info(self) -> dict[str, Any]:
        return {"package": PACKAGE, "version": importlib.metadata.version(PACKAGE),
                "onnxruntime": importlib.metadata.version("onnxruntime"), "model": MODEL,
                "model_dir": str(self.model_dir), "model_sha256": sha256_of(self.model_dir / ENCODER_FILE),
                "decoder_sha256": sha256_of(self.model_dir / DECODER_FILE), "cpu_threads": self.threads,
                "decoding": "greedy", "language": "en",
                "token_cap": f"{TOKENS_PER_SECOND_CAP:g} tokens/s of audio + {TOKENS_EXTRA}"}


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=2)
def _cached(threads: int) -> MoonshineTranscriber:
    return MoonshineTranscriber(threads)


def load(threads: int) -> MoonshineTranscriber:
    """Moonshine loaded and warmed once per process and thread count."""
    with _LOCK:
        return _cached(threads)
