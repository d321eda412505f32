"""Step 1: what came up — /health and /props as the server returned them."""

from __future__ import annotations

from pathlib import Path

from voice_llm.artifacts import HEALTH, PROPS
from voice_llm.lab.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    health = ctx.client.health()
    props = ctx.client.props()
    return [ctx.write_json(HEALTH, health), ctx.write_json(PROPS, props)]
