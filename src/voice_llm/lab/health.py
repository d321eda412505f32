"""Step 1: what came up — /health and /props as the server returned them.

A server without them (llama-cpp-python, vLLM, hosted APIs) still gets both files: health from its /v1/models
answer, props with that answer and null for what only /props tells (n_ctx, slots), each marked with its source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voice_llm.artifacts import HEALTH, PROPS
from voice_llm.lab.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    caps = ctx.capabilities
    # Only a server that answered /v1/models but not /health (or /props) gets the stand-in; otherwise the step
    # asks as for llama-server and a missing endpoint is its own clear error.
    openai_only = caps is not None and caps.has("/v1/models")
    health = health_from_models(ctx) if openai_only and not caps.has("/health") else ctx.client.health()
    props = props_from_models(ctx) if openai_only and not caps.has("/props") else ctx.client.props()
    return [ctx.write_json(HEALTH, health), ctx.write_json(PROPS, props)]


def health_from_models(ctx: LabContext) -> dict[str, Any]:
    assert ctx.capabilities is not None
    source, reason = ctx.capabilities.health_source()
    if source is None:
        return {"status": None, "source": None, "unknown": {"status": reason}}
    ctx.client.get_json("/v1/models")  # answered now, not only at the probe
    return {"status": "ok", "source": source, "unknown": {"/health": reason}}


def props_from_models(ctx: LabContext) -> dict[str, Any]:
    assert ctx.capabilities is not None
    _, reason = ctx.capabilities.n_ctx_source()
    models = ctx.client.get_json("/v1/models")[1] if ctx.capabilities.has("/v1/models") else None
    return {
        "source": "/v1/models" if models is not None else None,
        "models": models,
        "model": ctx.capabilities.model,
        "default_generation_settings": {"n_ctx": None},
        "total_slots": None,
        "unknown": {"n_ctx": reason, "total_slots": reason},
    }
