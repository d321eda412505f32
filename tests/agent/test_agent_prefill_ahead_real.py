"""--prefill-ahead against a real llama-server (the session's: the brief's shape, 1 slot): what the agent bets on.
Its one-token request for the conversation with the caller's turn leaves that prompt in the slot, so the
endpoint's own request for the same messages prefills next to nothing. Both arms in one run, on the primed system
prompt (4 KB documents, the agent's default), so only the relation is asserted, never a time. What it is worth at
the caller's ear is measured in BENCHMARKS.md ("Prefill ahead"), not here."""

from __future__ import annotations

import pytest
from agentkit import fake_engines

from conftest import RunningServer
from voice_llm.capabilities.agent.server import Agent
from voice_llm.capabilities.agent.settings import AgentSettings

LINE = "Hi, I'd like to come in for the first time. What should I bring as a new patient?"


def prefilled(agent: Agent, messages: list[dict[str, str]]) -> int:
    """The prompt tokens llama-server computed for the endpoint's request (its timings.prompt_n)."""
    result = agent.client.chat(messages, 8, True, model=agent.model)
    assert result.timings is not None and isinstance(result.timings.get("prompt_n"), int), result.timings
    return result.timings["prompt_n"]


@pytest.mark.slow
@pytest.mark.server
def test_after_a_prefill_ahead_the_endpoints_request_prefills_next_to_nothing(module_server: RunningServer) -> None:
    agent = Agent(AgentSettings(port=0, url=module_server.url), fake_engines())
    try:
        assert agent.settings.prefill_ahead is True  # the default
        agent.prepare()  # the system prompt primed, as before a call
        messages = [{"role": "system", "content": agent.system}, {"role": "user", "content": LINE}]
        plain = prefilled(agent, messages)  # the caller's turn, prefilled at the endpoint
        agent.prepare()  # the slot back to the system prompt alone
        got: list[int] = []
        agent.prefill_ahead(messages, got.append).result(timeout=120)
        ahead = prefilled(agent, messages)
    finally:
        agent.close()
    assert plain >= 10, plain  # the line's tokens and the template's: the work the endpoint no longer waits for
    assert got and got[0] >= plain - 2, (got, plain)  # the prefill ahead did that work
    assert ahead <= 2, (ahead, plain)  # the endpoint's request found it in the slot
