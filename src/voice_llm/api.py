"""The client side of the server: JSON endpoints (/health, /props, /slots) and chat streams, one base URL."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any

from voice_llm import sse


@dataclass(frozen=True)
class ServerClient:
    """Talks to one llama-server. Every call sends the API key, if any, as ``Authorization: Bearer``."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0

    def get_json(self, path: str, *, accept_status: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        """GET ``path`` and parse its JSON body; a status outside ``accept_status`` raises HTTPStatusError."""
        url = self.base_url.rstrip("/") + path
        conn, prefix = sse.open_connection(self.base_url, self.timeout)
        try:
            sse.connect(conn, self.base_url)
            try:
                conn.request("GET", prefix + path, headers=sse.request_headers(self.api_key))
                resp = conn.getresponse()
                if resp.status not in accept_status:
                    raise sse.error_from_response(resp, url)
                body = resp.read()
            except TimeoutError as exc:
                raise sse.StreamTimeoutError(f"{url} sent no answer within {self.timeout:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise sse.StreamTruncatedError(f"{url} broke the connection: {exc}") from exc
        finally:
            conn.close()
        try:
            return resp.status, json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise sse.MalformedEventError(f"{url} did not answer JSON: {body[:120]!r}") from exc

    def health(self) -> Any:
        return self.get_json("/health")[1]

    def props(self) -> Any:
        return self.get_json("/props")[1]

    def slots(self) -> Any:
        return self.get_json("/slots")[1]

    def chat(self, messages: Any, max_tokens: int = 64, cache_prompt: bool = True, **options: Any) -> sse.StreamResult:
        """One streaming chat request through the one reader, :func:`voice_llm.sse.run_stream`."""
        return sse.run_stream(
            messages, max_tokens, cache_prompt,
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, **options,
        )
