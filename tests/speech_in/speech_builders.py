"""Hostile and ordinary caller files, built byte by byte (no encoder run): WAVs of any header, and a FLAC stream of
hours of silence in a couple of MB (written frame by frame per the FLAC format, https://xiph.org/flac/format.html)."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np


def tone(rate: int, seconds: float = 1.0, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 220 * t) * amplitude).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> Path:
    """``samples`` (int16, interleaved) as a PCM WAV with ``width`` bytes a sample (1: unsigned 8-bit)."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        if width == 1:
            data = ((samples.astype(np.int32) >> 8) + 128).astype(np.uint8).tobytes()
        else:
            data = samples.astype("<i2").tobytes()
        out.writeframes(data)
    return path


def wav_claiming_rate(path: Path, rate: int) -> Path:
    """A 1 s mono 16-bit WAV whose header says ``rate`` Hz (and the byte rate to match, modulo 2**32)."""
    write_wav(path, tone(16000), 16000)
    data = bytearray(path.read_bytes())
    struct.pack_into("<II", data, 24, rate, (rate * 2) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    return path


# --- FLAC -------------------------------------------------------------------------------------------------------

BLOCK = 1152  # block size code 0b0011 (576 * 2**(3 - 2))
_RATE_CODES = {8000: 0b0100, 16000: 0b0101, 22050: 0b0110, 24000: 0b0111, 32000: 0b1000, 44100: 0b1001,
               48000: 0b1010}


def _crc_tables() -> tuple[np.ndarray, np.ndarray]:
    crc8 = np.zeros(256, np.uint8)
    crc16 = np.zeros(256, np.uint16)
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
        crc8[byte] = c
        c = byte << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x8005) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
        crc16[byte] = c
    return crc8, crc16


CRC8, CRC16 = _crc_tables()


def _utf8_number(n: np.ndarray, width: int) -> np.ndarray:
    """FLAC's UTF-8-like frame number coding of each n (all coded in ``width`` bytes), as a (len(n), width) array."""
    n = n.astype(np.int64)
    if width == 1:
        return n[:, None].astype(np.uint8)
    lead = {2: 0xC0, 3: 0xE0, 4: 0xF0}[width]
    cols = [lead | (n >> (6 * (width - 1)))]
    for k in range(width - 2, -1, -1):
        cols.append(0x80 | ((n >> (6 * k)) & 0x3F))
    return np.stack(cols, axis=1).astype(np.uint8)


def _frames(numbers: np.ndarray, rate: int, subframes: np.ndarray) -> bytes:
    """Frames ``numbers`` (one width of frame number each call), each with its mono 16-bit subframe bytes
    (``subframes``: (len(numbers), k) uint8), header CRC-8 and frame CRC-16, vectorised over frames."""
    if len(numbers) == 0:
        return b""
    width = 1 if numbers.max() < 0x80 else 2 if numbers.max() < 0x800 else 3 if numbers.max() < 0x10000 else 4
    head = np.zeros((len(numbers), 4), np.uint8)
    head[:, 0], head[:, 1] = 0xFF, 0xF8  # sync, fixed block size
    head[:, 2] = (0b0011 << 4) | _RATE_CODES[rate]
    head[:, 3] = (0b0000 << 4) | (0b100 << 1)  # mono, 16 bits a sample
    header = np.concatenate([head, _utf8_number(numbers, width)], axis=1)
    crc = np.zeros(len(numbers), np.uint8)
    for col in range(header.shape[1]):
        crc = CRC8[crc ^ header[:, col]]
    frame = np.concatenate([header, crc[:, None], subframes], axis=1)
    crc16 = np.zeros(len(numbers), np.uint16)
    for col in range(frame.shape[1]):
        crc16 = (crc16 << 8) ^ CRC16[((crc16 >> 8) ^ frame[:, col]) & 0xFF]
    tail = np.stack([(crc16 >> 8).astype(np.uint8), (crc16 & 0xFF).astype(np.uint8)], axis=1)
    return np.concatenate([frame, tail], axis=1).tobytes()


def flac_bomb(path: Path, rate: int = 16000, speech_s: float = 1.0, silence_s: float = 3 * 3600.0,
              state_total: bool = True) -> Path:
    """A FLAC named whatever ``path`` says: ``speech_s`` of a tone (verbatim subframes), then ``silence_s`` of
    digital silence (constant subframes: 3 bytes a block). ``state_total`` False writes 0 ("unknown") as
    STREAMINFO's total samples, so only decoding can tell the length. 3 h at 16 kHz is about 2.1 MB."""
    head = tone(rate, speech_s)
    speech_blocks = -(-len(head) // BLOCK)
    head = np.concatenate([head, np.zeros(speech_blocks * BLOCK - len(head), np.int16)])
    silent_blocks = int(silence_s * rate) // BLOCK
    total = (speech_blocks + silent_blocks) * BLOCK
    info = struct.pack(">HH", BLOCK, BLOCK) + b"\0" * 6
    packed = (rate << 44) | (0 << 41) | (15 << 36) | (total if state_total else 0)
    info += packed.to_bytes(8, "big") + b"\0" * 16
    out = [b"fLaC", bytes([0x80, 0, 0, len(info)]), info]  # last metadata block, STREAMINFO, 34 bytes
    verbatim = np.concatenate([np.full((speech_blocks, 1), 0x02, np.uint8),
                               head.astype(">i2").view(np.uint8).reshape(speech_blocks, -1)], axis=1)
    numbers = np.arange(speech_blocks + silent_blocks)
    # one call per frame-number width (1-4 bytes), speech first
    bounds = [0, 0x80, 0x800, 0x10000, 0x200000]
    for lo, hi in zip(bounds, bounds[1:]):
        chosen = numbers[(numbers >= lo) & (numbers < hi)]
        speech = chosen[chosen < speech_blocks]
        silent = chosen[chosen >= speech_blocks]
        out.append(_frames(speech, rate, verbatim[speech]))
        out.append(_frames(silent, rate, np.zeros((len(silent), 3), np.uint8)))  # CONSTANT subframe, value 0
    path.write_bytes(b"".join(out))
    return path
