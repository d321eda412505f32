"""argparse types for the numbers a command takes: a bad value is a usage error (one line, exit 2) before anything
is started or asked, never a value that runs and is recorded (a port 0 that falls back to 8080, a share of 2)."""

from __future__ import annotations

import argparse
import math
import urllib.parse


def port_number(text: str) -> int:
    """A TCP port, 1..65535 (0 would mean "any port" to the kernel, never a server to talk to)."""
    value = _int(text, "a port")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {text!r}")
    return value


def positive_int(text: str) -> int:
    return _whole_at_least(text, 1, "must be at least 1")


def non_negative_int(text: str) -> int:
    return _whole_at_least(text, 0, "must be 0 or more")


def positive_number(text: str) -> float:
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def non_negative_number(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def share(text: str) -> float:
    """A share of turns, 0..1."""
    value = _finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share is 0..1, not {text!r}")
    return value


def _whole_at_least(text: str, minimum: int, rule: str) -> int:
    value = _int(text, "a whole number")
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{rule}, not {text!r}")
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def server_url(text: str) -> str:
    """A server's base URL (``http://host:port``, may end in ``/v1``), never an endpoint: the chat path is added to
    it, so ``.../v1/chat/completions`` given here would be asked for ``.../v1/chat/completions/v1/chat/completions``."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL with a host: {text!r}")
    path = parts.path.rstrip("/")
    for endpoint in ("/chat/completions", "/completions", "/models", "/health", "/props", "/slots"):
        if path.endswith(endpoint):
            base = f"{parts.scheme}://{parts.netloc}{path[: -len(endpoint)]}"
            raise argparse.ArgumentTypeError(f"give the server's base URL, not an endpoint: {base!r} instead of {text!r}")
    return text
