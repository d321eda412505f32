"""The whole lab against a second real backend: llama-cpp-python's OpenAI-compatible server.

It has no /health, /props, /slots or /metrics and its stream carries no timings: the lab must still complete,
write null with the reason for what it cannot know, and `check` must name those relations "not checkable"
instead of passing them. Its raw SSE bytes are recorded and compared with llama-server's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clihelpers import SHORT_KB, WITHOUT_THE_CALL

from voice_llm.core.client.api import ServerClient
from voice_llm.core.client.capabilities import SOURCE_CLIENT, probe
from voice_llm.core.sse import SSEDecoder

# A whole lab takes ~3 min on an idle 2-core machine and far longer on a shared one.
pytestmark = [pytest.mark.server, pytest.mark.backend, pytest.mark.timeout(2400)]

# The relations that rest on llama-server-only evidence (/props, timings, /slots).
NOT_CHECKABLE = (
    "props: context size",
    "prefill: prompt tokens grow 0 -> 4 -> 12 docs",
    "prefill: server prefill time grows 0 -> 4 -> 12 docs",
    "cache hit far below miss: prompt tokens",
    "cancel: the server stopped (slot went idle)",
    # the per-repeat halves of the same relations
    "prefill repeats: medians, prompt_n grows in each",
    "cache repeats: medians, hit and miss in each",
    "cancel repeats: median idle, each a cut",
)


def load(out: Path, name: str):
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def lcp_lab(llama_cpp_python_server, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("lcp-lab")
    done = subprocess.run(
        # What is tested is what this server exposes, not the spread of its times or the length of the documents:
        # one repeat, the short KB, and no call (the call's agent asks the LLM through the same client the steps
        # use; the session lab calls it on llama-server). Three repeats of the full lab took ~3.5 min in CI.
        # No speech either (tts left out): the speak step reads the answer through that same client and its checks
        # rest on the client's clock alone; that it completes and passes against servers without /props or
        # timings is tests/run/test_identity_shapes.py's whole labs' (vLLM- and Ollama-shaped, with Piper).
        [sys.executable, "-m", "voice_llm", "lab", "--url", llama_cpp_python_server.url, "--out", str(out),
         "--repeat", "1", "--kb", str(SHORT_KB)],
        capture_output=True, text=True, timeout=2000,
        env={**os.environ, "VOICE_LLM_WITHOUT": f"{WITHOUT_THE_CALL['VOICE_LLM_WITHOUT']},tts"},
    )
    return out, done


def test_the_lab_completes_and_check_names_what_it_cannot_see(lcp_lab) -> None:
    out, done = lcp_lab
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for name in NOT_CHECKABLE:
        line = next(line for line in lines if f"  {name}: " in line)
        assert line.startswith("N/C ") and " is null" in line, line
    assert not [line for line in lines if line.startswith("FAIL")]
    assert re.search(r"\d+ passed, \d+ findings?, \d+ not checkable, 0 failed", done.stdout)
    assert "what this server exposed" in done.stdout
    page = (out / "report.html").read_text()
    assert 'id="section-capabilities"' in page and "not checkable from these files" in page


def test_capabilities_record_what_it_exposes(lcp_lab) -> None:
    out, _ = lcp_lab
    caps = load(out, "capabilities.json")
    endpoints = caps["found"]["endpoints"]
    assert {path: endpoints[path]["status"] for path in endpoints} == {
        "/health": 404, "/props": 404, "/slots": 404, "/v1/models": 200, "/metrics": 404}
    assert caps["found"]["model_ids"] == ["smollm2-135m-instruct"]
    stream = caps["found"]["stream"]
    assert stream["timings_fields"] == [] and stream["done"] and stream["role_chunk_first"]
    inferred = caps["inferred"]
    assert inferred["model"] == {"name": "smollm2-135m-instruct", "source": "/v1/models"}
    assert inferred["cancel_stop"]["source"] is None
    assert inferred["cancel_stop"]["reason"].startswith("server stop not observable")
    assert inferred["cache_reuse"]["source"] is None and inferred["cache_off"]["shown"] is False


def test_steps_write_null_with_the_reason(lcp_lab) -> None:
    out, _ = lcp_lab
    assert load(out, "health.json")["source"] == "/v1/models"
    assert load(out, "props.json")["default_generation_settings"]["n_ctx"] is None
    for row in load(out, "prefill.json"):
        assert row["prompt_ms"] is None and row["unknown"]["prompt_ms"]
        assert row["sources"]["ttft_ms"] == SOURCE_CLIENT and row["ttft_ms"] > 0
    cache = load(out, "cache.json")
    assert cache["first"]["prompt_n"] is None and "client clock only" in cache["unknown"]["prompt_n"]
    # The client clock still shows the reuse: llama-cpp-python keeps the previous prompt's KV state.
    assert cache["second"]["ttft_ms"] < cache["first"]["ttft_ms"] / 2
    cancel = load(out, "cancel.json")
    assert 0 < cancel["received_tokens"] < cancel["max_tokens"] and cancel["closed_at_ms"] >= 500
    assert cancel["slot_idle_after_ms"] is None
    assert cancel["unknown"]["slot_idle_after_ms"].startswith("server stop not observable")
    ttft = load(out, "ttft.json")
    assert ttft["sources"]["tokens"] in ("usage", "client count of content chunks")
    assert "cache_off" in ttft["unknown"]
    report = load(out, "report.json")
    assert report["cancel_idle_ms"] is None and report["ttft_p50_ms"] > 0
    # Every request named the model from /v1/models (OpenAI-style servers may require it).
    assert (out / "raw" / "ttft-1.sse").is_file()


def _events(raw: bytes) -> list[object]:
    events = SSEDecoder().feed(raw)
    return [e.data if e.data == "[DONE]" else json.loads(e.data) for e in events]


def test_its_raw_stream_differs_from_llama_servers(lcp_lab, module_server) -> None:
    """The recorded bytes of both servers, side by side: framing, first chunk, timings."""
    out, _ = lcp_lab
    lcp_raw = (out / "sse_raw.txt").read_bytes()
    llama = probe(ServerClient(module_server.url), raw_out=out / "llama-server-probe.sse")
    llama_raw = (out / "llama-server-probe.sse").read_bytes()
    lcp_events, llama_events = _events(lcp_raw), _events(llama_raw)
    # Both: data-only events ending in a blank line, the role chunk first and [DONE] last.
    assert lcp_events[-1] == llama_events[-1] == "[DONE]"
    assert llama.stream is not None and llama.stream.line_ending == "LF"
    # llama-server's role chunk says content null; llama-cpp-python's has no content key at all.
    assert llama_events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert "content" not in lcp_events[0]["choices"][0]["delta"]
    # Only llama-server sends its timings.
    assert any("timings" in e for e in llama_events if isinstance(e, dict))
    assert not any("timings" in e for e in lcp_events if isinstance(e, dict))
    # Every byte it sent in the whole lab: LF line ends (llama-cpp-python passes sep="\n" to sse-starlette, so
    # not the CRLF sse-starlette defaults to), and the only comments are sse-starlette's pings, which come every
    # 15 s while a long prompt is read (`: ping - 2026-11-30 08:53:11.499700+00:00`).
    raws = [path.read_bytes() for path in (out / "raw").glob("*.sse")]
    assert raws and not any(b"\r" in raw for raw in raws)
    comments = [line for raw in raws for line in raw.split(b"\n") if line.startswith(b":")]
    assert all(re.fullmatch(rb": ping - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\+00:00", line) for line in comments), comments
    assert load(out, "capabilities.json")["found"]["stream"]["line_ending"] == "LF"
