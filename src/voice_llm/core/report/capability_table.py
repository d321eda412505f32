"""The capability table — what this server exposed and what the lab inferred from it — from capabilities.json
alone, for the terminal summary and report.html."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.errors import ArtifactError
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import CAPABILITIES


def _status(endpoints: Mapping[str, Any], path: str) -> str:
    found = endpoints.get(path) or {}
    status = found.get("status")
    if status is None:
        return f"no answer ({found.get('note') or 'not probed'})"
    return f"HTTP {status}"


def _entry(inferred: Mapping[str, Any], key: str, what: str) -> str:
    item = inferred.get(key) or {}
    source = item.get("source")
    return f"{what}: {source}" if source else f"{what}: null ({item.get('reason') or 'unknown'})"


def _fields(values: Any) -> str:
    return ", ".join(values) if values else "none"


def capability_rows(doc: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(what was probed, what the server showed, what the lab does with it), one row each."""
    found, inferred = doc.get("found") or {}, doc.get("inferred") or {}
    endpoints = found.get("endpoints") or {}
    stream = found.get("stream") or {}
    model = inferred.get("model") or {}
    cache_off = inferred.get("cache_off") or {}
    ids = found.get("model_ids") or []
    gauge = found.get("busy_gauge")
    rows = [
        ("server", found.get("server_header") or "no Server header", inferred.get("server") or "unknown"),
        ("/health", _status(endpoints, "/health"), _entry(inferred, "health", "health")),
        ("/props", _status(endpoints, "/props"), _entry(inferred, "n_ctx", "n_ctx")),
        ("/slots", _status(endpoints, "/slots"), _entry(inferred, "cancel_stop", "server stop after cancel")),
        ("/metrics", _status(endpoints, "/metrics") + (f", gauge {gauge}" if gauge else ""),
         "requests in flight: " + (gauge or "not published")),
        ("/v1/models", _status(endpoints, "/v1/models") + (f", {len(ids)} id(s)" if ids else ""),
         f"model sent: {model.get('name') or 'none'} (from {model.get('source') or 'nowhere'})"),
    ]
    if found.get("stream_error"):
        rows.append(("stream", f"probe failed: {found['stream_error']}", "counts: null"))
        return rows
    rows += [
        ("stream timings", _fields(stream.get("timings_fields")), _entry(inferred, "prompt_tokens", "prompt tokens")
         + "; " + _entry(inferred, "cache_reuse", "cache reuse")),
        ("stream usage", _fields(stream.get("usage_fields"))
         + ("" if stream.get("include_usage_accepted") else " (include_usage refused)"),
         "generated tokens: " + str((inferred.get("generated_tokens") or {}).get("source"))),
        ("cache off", "cache_n shown" if cache_off.get("shown") else "not shown",
         "cache_prompt false verified" if cache_off.get("shown") else str(cache_off.get("reason"))),
        ("SSE framing", f"{stream.get('line_ending')} line ends, {stream.get('comment_lines', 0)} comment line(s)",
         ("role chunk first" if stream.get("role_chunk_first") else "no role-only first chunk")
         + (", [DONE] last" if stream.get("done") else ", no [DONE]")),
    ]
    return rows


def read_capability_rows(out: RunFolder | Path) -> list[tuple[str, str, str]] | None:
    """The rows for OUT, or None when the run has no capabilities.json (an older run). A file that is not JSON,
    or not of capabilities.json's shape, is an ArtifactError naming it (one line, never a traceback)."""
    folder = RunFolder.of(out)
    out = folder.path
    if not folder.is_file(CAPABILITIES):
        return None
    doc = folder.json(CAPABILITIES)
    try:
        if not isinstance(doc, Mapping):
            raise TypeError(f"should be a JSON object, got {type(doc).__name__}")
        # Every cell as text: a number where a string belongs would otherwise fail later, in the table printer.
        return [(str(a), str(b), str(c)) for a, b, c in capability_rows(doc)]
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        # A field of another type than probe() writes (a list for "found", a number for an endpoint...).
        raise ArtifactError(f"{CAPABILITIES} in {out} is malformed ({type(exc).__name__}: {exc})") from exc
