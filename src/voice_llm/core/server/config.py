"""The one place that knows where the server listens and how it is started."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from voice_llm.core.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_CTX = 4096
DEFAULT_SLOTS = 1

ENV_API_KEY = "VOICE_LLM_API_KEY"
ENV_SERVER_BIN = "VOICE_LLM_SERVER_BIN"
ENV_MODEL = "VOICE_LLM_MODEL"
ENV_CACHE = "VOICE_LLM_CACHE"
ENV_STATE = "VOICE_LLM_STATE"


def cache_dir() -> Path:
    """Where the llama-server build and the model are kept between runs (``~/.cache/voice-llm``)."""
    return Path(os.environ.get(ENV_CACHE) or platformdirs.user_cache_path("voice-llm"))


def state_dir() -> Path:
    """Where pid files and server logs live (``~/.local/state/voice-llm``)."""
    return Path(os.environ.get(ENV_STATE) or platformdirs.user_state_path("voice-llm"))


def default_out_dir(name: str | None = None) -> Path:
    """The brief's artifact folder: ``~/voice/llm`` (``/root/voice/llm`` for root); ``name``: a command's own folder
    beside it (``~/voice/dial``)."""
    return Path.home() / "voice" / (name or "llm")


def api_key_from_env(explicit: str | None) -> str | None:
    return explicit or os.environ.get(ENV_API_KEY) or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """How the managed llama-server is started. ``argv`` and ``env`` are the only place its flags are built;
    the API key travels in the environment (``LLAMA_API_KEY``), never on the command line, so it cannot show in
    ``ps``, in the state file or in ``status``."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    ctx: int = DEFAULT_CTX
    slots: int = DEFAULT_SLOTS
    threads: int | None = None
    api_key: str | None = field(default=None, repr=False)
    allow_remote: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port must be between 1 and 65535, not {self.port}")
        if self.ctx < 256:
            raise ConfigError(f"--ctx must be at least 256 tokens, not {self.ctx}")
        if self.slots < 1:
            raise ConfigError(f"--slots must be at least 1, not {self.slots}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, not {self.threads}")
        if not is_loopback(self.host) and not self.api_key and not self.allow_remote:
            raise ConfigError(
                f"--host {self.host} would open the model server to the network without a key: "
                "pass --api-key (or VOICE_LLM_API_KEY), or --allow-remote to do it anyway"
            )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def argv(self, binary: Path, model: Path) -> list[str]:
        # The brief's setting: context 4096, one slot (-np defaults to 4 slots sharing the KV cache), and no
        # host-RAM prompt cache (--cache-ram 0) so only the slot's own KV prefix can be reused.
        args = [
            str(binary), "-m", str(model), "--host", self.host, "--port", str(self.port),
            "-c", str(self.ctx), "-np", str(self.slots), "--cache-ram", "0",
        ]
        if self.threads:
            args += ["-t", str(self.threads)]
        return args

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.pop("LLAMA_API_KEY", None)
        if self.api_key:
            env["LLAMA_API_KEY"] = self.api_key
        return env
