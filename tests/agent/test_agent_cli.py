"""`voice-llm agent`'s flags: bad values, and settings that contradict each other, are usage errors (exit 2, one
line) before anything loads; --engine pipecat dispatches to pipecat_agent.serve, resolved only then."""

from __future__ import annotations

import pytest

from voice_llm.capabilities.agent import command
from voice_llm.capabilities.agent import settings as settings_module
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.cli.main import main


@pytest.mark.parametrize("args, says", [
    (["--listen", "nowhere"], "HOST:PORT"),
    (["--listen", "127.0.0.1:70000"], "0..65535"),
    (["--max-calls", "0"], "at least 1"),
    (["--otlp", "ftp://collector:4318"], "OTLP"),
    (["--protocol", "sip"], "--protocol must be one of twilio, pcm"),
    (["--max-tokens", "5000"], "--max-tokens must be 1-4096, not 5000"),  # a rule argparse alone did not hold
    (["--stt-window", "40"], "--stt-window must be 1-30 s, not 40"),
    (["--tts-threads", "0"], "--tts-threads"),
    (["--url", "http://127.0.0.1:8080/v1/chat/completions"], "base URL"),
])
def test_bad_flags_are_usage_errors(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["agent", *args])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["--protocol", "pcm", "--rate", "100"], "rate"),
    (["--engine", "pipecat", "--preemptive"], "builtin engine"),
    (["--engine", "pipecat", "--prefill-ahead"], "builtin engine"),
    (["--stt", "none", "--preemptive"], "--stt none"),
    (["--stt", "none", "--prefill-ahead"], "--stt none"),
    (["--engine", "pipecat", "--endpoint-ms", "100"], "pipecat's VAD stop"),
])
def test_contradicting_settings_are_one_usage_line(args: list[str], says: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Refused where every bad value is, the settings' own rules, before anything loads: the usage status, one
    error line after the usage."""
    with pytest.raises(SystemExit) as exited:
        main(["agent", *args])
    assert exited.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("voice-llm agent: error:")]
    assert len(err) == 1 and says in err[0], err


def test_engine_pipecat_runs_its_serve_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, AgentSettings]] = []

    real = command.registry.resolve

    def resolve(reference: str):  # type: ignore[no-untyped-def]
        if reference != command.PIPECAT_SERVE:
            return real(reference)
        return lambda settings: seen.append((reference, settings)) or 0

    monkeypatch.setattr(command.registry, "resolve", resolve)
    assert main(["agent", "--engine", "pipecat", "--turn", "smart", "--listen", "127.0.0.1:0", "--protocol", "twilio",
                 "--otlp", "http://127.0.0.1:4318/v1/traces", "--max-calls", "3"]) == 0
    (reference, settings), = seen
    assert reference == "voice_llm.capabilities.agent.pipecat_agent:serve"
    assert (settings.engine, settings.turn, settings.port, settings.max_calls) == ("pipecat", "smart", 0, 3)
    assert settings.otlp == "http://127.0.0.1:4318"  # the base: the exporter adds /v1/traces


def test_preemptive_implies_speculative_stt() -> None:
    settings = command.settings_from({"preemptive": True, "speculative_stt": False})
    assert settings.preemptive and settings.speculative_stt  # the reply starts from the speculative transcript


def test_the_preemptive_default_never_reenables_speculation() -> None:
    """The measured defaults (settings.DEFAULT_SPECULATIVE_STT and DEFAULT_PREEMPTIVE: BENCHMARKS.md). The
    preemptive default, whatever it is, never turns speculative STT back on nor applies to pipecat or --stt none."""
    default = command.settings_from({})
    assert default.speculative_stt and default.preemptive is settings_module.DEFAULT_PREEMPTIVE
    plain = command.settings_from({"speculative_stt": False})
    assert not plain.speculative_stt and not plain.preemptive
    assert not command.settings_from({"engine": "pipecat"}).preemptive
    assert not command.settings_from({"stt": "none"}).preemptive
    assert command.settings_from({"preemptive": True}).preemptive
    # prefill ahead (settings.DEFAULT_PREFILL_AHEAD) the same way, and it implies speculative STT as preemptive does
    assert default.prefill_ahead is settings_module.DEFAULT_PREFILL_AHEAD
    assert not plain.prefill_ahead and not command.settings_from({"engine": "pipecat"}).prefill_ahead
    assert not command.settings_from({"stt": "none"}).prefill_ahead
    asked = command.settings_from({"prefill_ahead": True, "preemptive": False, "speculative_stt": False})
    assert asked.prefill_ahead and asked.speculative_stt and not asked.preemptive


def test_preemptive_asked_of_pipecat_is_refused_but_its_default_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[AgentSettings] = []
    real = command.registry.resolve

    def resolve(reference: str):  # type: ignore[no-untyped-def]
        return (lambda s: served.append(s) or 0) if reference == command.PIPECAT_SERVE else real(reference)

    monkeypatch.setattr(command.registry, "resolve", resolve)
    assert main(["agent", "--engine", "pipecat", "--listen", "127.0.0.1:0"]) == 0
    assert served and served[0].preemptive is False
    with pytest.raises(SystemExit) as exited:  # contradicts: a usage error
        main(["agent", "--engine", "pipecat", "--preemptive", "--listen", "127.0.0.1:0"])
    assert exited.value.code == 2


def test_piper_threads_are_onnxruntimes_unless_told() -> None:
    """The measured default (settings.DEFAULT_TTS_THREADS): onnxruntime's own, one per core; --tts-threads sets it."""
    assert command.settings_from({}).tts_threads is None and AgentSettings().tts_threads is None
    assert command.settings_from({"tts_threads": 1}).tts_threads == 1


def test_the_url_help_names_the_agents_own_default_not_a_port_flag_it_lacks() -> None:
    """`agent --help` said "default: the managed one on --port", but the agent has no --port: its help names the
    URL it does use when none is given (settings_from)."""
    from voice_llm.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    agent = sub.choices["agent"]
    assert not any("--port" in action.option_strings for action in agent._actions)
    url = next(action for action in agent._actions if "--url" in action.option_strings)
    assert "--port" not in (url.help or "")
    default = command.settings_from({}).url
    assert default in (url.help or "")
