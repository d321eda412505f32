"""The call's settings as data (issue 42 item 3): `--jitter-ms` was validated three times on its way from the parser
to the phone's playout (an argparse type, DialOptions, Playout), each with its own words. Its rule is declared once,
with the setting (DialOptions.jitter_ms), and checked once, when the settings are made: a bad value is one usage
line, a good one passes that one check and nothing else on its way to the playout buffer."""

from __future__ import annotations

from pathlib import Path

import pytest

from voice_llm.capabilities.dial import call as callmod
from voice_llm.capabilities.dial.step import MAX_JITTER_MS, DialOptions
from voice_llm.cli import main as cli
from voice_llm.core.run import flags
from voice_llm.engines.line.playout import Playout


@pytest.mark.parametrize("value, says", [
    ("2000", "--jitter-ms must be 0-1000 ms, not 2000"),
    ("-1", "--jitter-ms must be 0-1000 ms, not -1"),
    ("soon", "argument --jitter-ms: not a number: 'soon'"),
    ("inf", "argument --jitter-ms: not a finite number: 'inf'"),
])
@pytest.mark.parametrize("command", [["dial", "ws://127.0.0.1:9/"], ["converse"]])
def test_a_bad_jitter_is_one_usage_line(command: list[str], value: str, says: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--jitter-ms", value, "--out", str(tmp_path / "out")])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert errors == [f"voice-llm {command[0]}: error: {says}"], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_jitter_is_checked_once_from_the_flag_to_the_playout(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check of a jitter delay counted on the whole way: the flag parsed, the settings made (the usage guard),
    the step's options, the call's settings, the playout buffer."""
    checked: list[float] = []
    real = flags.Between.refusal

    def counting(rule: flags.Between, value: float) -> str | None:
        if rule.high == MAX_JITTER_MS:
            checked.append(value)
        return real(rule, value)

    monkeypatch.setattr(flags.Between, "refusal", counting)
    parser = cli.build_parser()
    args = parser.parse_args(["dial", "ws://127.0.0.1:9/", "--jitter-ms", "60", "--out", str(tmp_path)])
    cli._refuse_bad_options(parser, args)
    options = cli._lab_settings(args, "dial").options.plugin("dial", None)
    settings = options.call_settings("ws://127.0.0.1:9/")
    playout = Playout(settings.line.frame_samples, settings.line.rate, settings.jitter_ms, settings.cap_s)
    assert playout.jitter_frames == 3 and checked == [60.0]


def test_the_jitter_flag_says_the_default_the_settings_hold() -> None:
    """One place for the default: the declaration. The help says it, and DialOptions and the call hold it."""
    parser = cli.build_parser()
    dial = next(action for action in parser._actions if action.dest == "command").choices["dial"]
    jitter = next(action for action in dial._actions if action.dest == "jitter_ms")
    default = DialOptions().jitter_ms
    assert f"(default {default:g})" in jitter.help and jitter.default is None
    assert DialOptions().call_settings("ws://127.0.0.1:9/").jitter_ms == default == callmod.CallSettings.jitter_ms


def test_converse_refuses_a_line_its_agent_does_not_serve(capsys: pytest.CaptureFixture[str]) -> None:
    """converse's --protocol is the agent's: the builtin agent serves twilio and pcm, and says so in one line."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["converse", "--protocol", "telnyx"])
    assert exited.value.code == cli.EXIT_USAGE
    (error,) = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert error == "voice-llm converse: error: --protocol 'telnyx': the builtin agent serves twilio, pcm"
