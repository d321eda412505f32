"""Step 1: what came up — /health and /props as the server returned them.

Servers answer /health in different ways: llama-server with ``{"status": "ok"}``, vLLM, SGLang and TGI with HTTP
200 and an empty body, some with plain text; llama-cpp-python and Ollama have no /health at all (404), and their
model list (/v1/models) is the sign of life. health.json records what was seen: the route it was taken from,
the HTTP status, the JSON body's fields beside those (llama-server's ``status``), or the body as text when it is
not JSON, and the routes tried before it. A server without /props gets a props.json with its /v1/models answer
and null for what only /props tells (n_ctx, slots), each marked with its source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voice_llm.core import sse
from voice_llm.core.util.artifacts import HEALTH, PROPS
from voice_llm.core.client.capabilities import fetch, model_ids
from voice_llm.core.errors import MeasurementError
from voice_llm.core.run.context import LabContext

HEALTH_ROUTE = "/health"
MODELS_ROUTE = "/v1/models"
TEXT_LIMIT = 2000  # characters of a non-JSON body kept in health.json


def run(ctx: LabContext) -> list[Path]:
    caps = ctx.capabilities
    health = health_document(ctx)
    # Only a server that answered /v1/models but not /props gets the stand-in; otherwise the step asks as for
    # llama-server and a missing endpoint is its own clear error.
    openai_only = caps is not None and caps.has(MODELS_ROUTE)
    props = props_from_models(ctx) if openai_only and not caps.has("/props") else ctx.client.props()
    return [ctx.write_json(HEALTH, health), ctx.write_json(PROPS, props)]


def _seen(route: str, status: int | None, note: str, body: bytes) -> tuple[dict[str, Any], Any]:
    """What one GET showed: its route and status, and the body (parsed when it is JSON, else as text)."""
    seen: dict[str, Any] = {"route": route, "http_status": status}
    if status is None:
        seen["error"] = note
        return seen, None
    try:
        parsed = sse.parse_json(body) if body.strip() else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        parsed = None
    if parsed is None:
        seen["body_text"] = body.decode("utf-8", "replace")[:TEXT_LIMIT]
    return seen, parsed


def health_document(ctx: LabContext) -> dict[str, Any]:
    """health.json: the server's health route when it has one (any answer of HTTP 200 says it is up, whatever
    the body), else its model list. A health route that answers an error status is the step's error."""
    found, body = fetch(ctx.client, HEALTH_ROUTE)
    seen, parsed = _seen(HEALTH_ROUTE, found.status, found.note, body)
    if found.status == 200:
        fields = dict(parsed) if isinstance(parsed, dict) else ({"body": parsed} if parsed is not None else {})
        return {**fields, **seen, "source": HEALTH_ROUTE, "server_header": found.server}
    if found.status is None:
        raise sse.ServerUnreachableError(f"{ctx.client.base_url}{HEALTH_ROUTE}: {found.note}")
    if found.status not in (404, 405):
        raise MeasurementError(f"{ctx.client.base_url}{HEALTH_ROUTE} answered HTTP {found.status}: the server is "
                               f"not ready ({_short(seen, parsed)})")
    # No health route: the model list is the sign of life (llama-cpp-python, Ollama).
    models, models_body = fetch(ctx.client, MODELS_ROUTE)
    listed, models_doc = _seen(MODELS_ROUTE, models.status, models.note, models_body)
    ids = list(model_ids(models_doc))
    if models.status != 200 or not ids:
        raise MeasurementError(
            f"{ctx.client.base_url} has no health route ({HEALTH_ROUTE} answered HTTP {found.status}) and "
            f"{MODELS_ROUTE} lists no model ({_short(listed, models_doc)}): is this an OpenAI-compatible server?")
    return {
        **listed, "source": MODELS_ROUTE, "model_ids": ids, "server_header": models.server,
        "tried": [seen],
        "unknown": {HEALTH_ROUTE: f"{HEALTH_ROUTE} answered HTTP {found.status}; the server answered {MODELS_ROUTE}"},
    }


def _short(seen: dict[str, Any], parsed: Any) -> str:
    if parsed is not None:
        return json.dumps(parsed)[:200]
    return repr(seen.get("body_text", seen.get("error", "")))[:200]


def props_from_models(ctx: LabContext) -> dict[str, Any]:
    assert ctx.capabilities is not None
    _, reason = ctx.capabilities.n_ctx_source()
    models = ctx.client.get_json(MODELS_ROUTE)[1] if ctx.capabilities.has(MODELS_ROUTE) else None
    return {
        "source": MODELS_ROUTE if models is not None else None,
        "models": models,
        "model": ctx.capabilities.model,
        "default_generation_settings": {"n_ctx": None},
        "total_slots": None,
        "unknown": {"n_ctx": reason, "total_slots": reason},
    }
