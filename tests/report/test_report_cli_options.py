"""Every command offers exactly the options it uses, shows their defaults, and the exit codes are in --help.

What a command uses is read from its implementation, not from a list kept beside the parser: for a lab step, the
StepOptions fields (and a capability's options, e.g. tts's engine) its module reads (``options.<field>``), its
documents (``ctx.kb_dir``) and, for a step that asks the server, the request flags every ServerClient takes; for
every other command, the ``args.<dest>`` its handler in cli.py reads (following the cli functions it calls), or
for `load` (a command the load capability adds) the LoadSettings fields voice_llm.capabilities.load's cli, run and
document read. Adding an option a command ignores fails test_every_offered_option_is_used.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from voice_llm.core import registry
from voice_llm.core.run import flags
from voice_llm.cli import main as cli
from voice_llm.core.lab.steps import STEPS
from clihelpers import cli_env

_ARGS_READ = re.compile(r"""args\.(\w+)|getattr\(args, "(\w+)\"""")
# StepOptions field, or tts's TTSOptions field -> the flag's dest (voice_llm.cli.main._lab_settings builds
# StepOptions from them, voice_llm.capabilities.speak.step.options_value the TTS options).
_STEP_OPTION_FLAGS = {"repeat": "repeat", "engine": "tts", "voice": "voice", "clause_words": "clause_words"}
# What pipeline._connect gives every ServerClient, hence every step that asks the server.
_REQUEST_FLAGS = {"url", "port", "api_key", "model", "timeout", "deadline"}
# What _lab_settings gives every step that asks the server: a run in OUT made against another server is refused
# unless --new-run replaces it (voice_llm.core.run.session.Session).
_JOINING_FLAGS = {"new_run"}
_EVERY_STEP = {"out", "wait", "quiet"}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def offered(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def _cli_source(function: object) -> str:
    """The source of a cli.py function and of every cli.py function it calls, transitively."""
    seen: dict[str, str] = {}
    todo = [function.__name__]  # type: ignore[attr-defined]
    while todo:
        name = todo.pop()
        if name in seen or not inspect.isfunction(getattr(cli, name, None)):
            continue
        seen[name] = inspect.getsource(getattr(cli, name))
        todo += re.findall(r"\b(_?\w+)\(", seen[name])
    return "\n".join(seen.values())


def _args_read(source: str) -> set[str]:
    return {a or b for a, b in _ARGS_READ.findall(source)}


def _body(source: str) -> str:
    return source.split(":\n", 1)[1] if ":\n" in source else source


def _package_source(module: object) -> str:
    """Every module's source in the package ``module`` is in (a capability's)."""
    folder = Path(inspect.getfile(module)).parent  # type: ignore[arg-type]
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.py")))


def _derived_flags_read(module: object) -> set[str]:
    """The dests of the flags ``module`` derives from settings declarations (its voice_llm.core.run.flags.Flags
    values) whose setting is read (``.<field>``) in the package of the module or of the settings class: a flag
    derived from a setting nothing reads is a flag the command ignores."""
    used: set[str] = set()
    todo = [value for value in vars(module).values() if isinstance(value, flags.Flags)]
    while todo:
        derived = todo.pop()
        source = _package_source(module) + _package_source(importlib.import_module(derived.settings.__module__))
        for name in derived.names():
            inner = flags.nested_settings(derived.settings, name)
            if inner is not None:
                todo.append(flags.Flags(inner))
            elif re.search(rf"\.{name}\b", source):
                used.add(derived.dest(name))
    return used


def _plugin_flags_read(command: str | None = None) -> set[str]:
    """The flags read (``values.get("...")``) by the options values of the registered capabilities that offer flags
    to ``command`` and of those they require (dial and agent require tts); None: every capability, as the
    lab's handler builds them all."""
    capabilities = {c.name: c for c in registry.capabilities()}
    readers = set(capabilities)
    if command is not None:
        readers = set()
        for capability in capabilities.values():
            if capability.cli:
                probe = argparse.ArgumentParser(add_help=False)
                registry.resolve(capability.cli)(probe, command)
                if probe._actions:  # noqa: SLF001 - argparse has no public list of what was added
                    readers |= {capability.name, *capability.requires}
    used: set[str] = set()
    for name in readers:
        if capabilities[name].options:
            options = registry.resolve(capabilities[name].options)
            used |= set(re.findall(r'values(?:\.get\(|\[)"(\w+)"', inspect.getsource(options)))
            used |= _derived_flags_read(importlib.import_module(options.__module__))
    return used


def used_by(command: str) -> set[str]:
    """The dests ``command`` reads, from its implementation."""
    if command in STEPS:
        step = STEPS[command]
        module = inspect.getsource(importlib.import_module(step.module))
        used = set(_EVERY_STEP)
        used |= {_STEP_OPTION_FLAGS[f] for f in re.findall(r"options\.(\w+)", module) if f in _STEP_OPTION_FLAGS}
        if "ctx.kb_dir" in module:
            used.add("kb")
        if step.needs_server:
            used |= _REQUEST_FLAGS | _JOINING_FLAGS
        # Every capability's options value reads the flags it added (cli._plugin_options builds them all).
        used |= _plugin_flags_read(command)
        # What cmd_step itself reads beyond the settings every step shares (report's --compare and --force).
        return used | (_args_read(inspect.getsource(cli.cmd_step) + inspect.getsource(cli.cmd_report_compare))
                       - {"command"})
    if command == "load":  # a command the load capability adds: the flags derived from LoadSettings whose setting
        # its package reads, and those its settings_from reads itself (--api-key)
        module = importlib.import_module("voice_llm.capabilities.load.cli")
        return set(re.findall(r'values(?:\.get\(|\[)"(\w+)"', inspect.getsource(module))) | _derived_flags_read(module)
    if command == "agent":  # a command the agent capability adds: the flags derived from its settings, and those
        # its settings_from reads itself (--listen, --settings)
        module = importlib.import_module("voice_llm.capabilities.agent.settings")
        return set(re.findall(r'values(?:\.get\(|\[)"(\w+)"', inspect.getsource(module))) | _derived_flags_read(module)
    handler = cli.COMMANDS[command]
    source = _cli_source(handler)
    used = _args_read(source)
    if "_plugin_options(" in source:  # each capability's options value reads the flags it added (tts: --tts ...)
        used |= _plugin_flags_read()
    if "progress" in _body(inspect.getsource(handler)):  # main makes the progress from --quiet
        used.add("quiet")
    return used


def unused_options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    return {name: offered(sub) - used_by(name) for name, sub in subparsers(parser).items()
            if offered(sub) - used_by(name)}


def test_every_offered_option_is_used() -> None:
    assert unused_options(cli.build_parser()) == {}


def test_the_derivation_reads_the_implementation() -> None:
    # Not vacuous: the steps that repeat read options.repeat, ttft (five runs, the brief's) does not.
    assert "repeat" in used_by("prefill") and "repeat" not in used_by("ttft")
    assert {"tts", "voice", "clause_words"} <= used_by("speak") and "tts" not in used_by("sentence")
    assert "kb" in used_by("cache") and "kb" not in used_by("sse")
    assert not _REQUEST_FLAGS & used_by("report")  # report reads the files alone
    assert "deadline" not in used_by("load") and "timeout" in used_by("load")
    assert "quiet" not in used_by("compare") and "out_positional" in used_by("check")


@pytest.mark.parametrize("command, flag", [("ttft", "--repeat"), ("report", "--url"), ("report", "--timeout"),
                                           ("health", "--repeat"), ("load", "--deadline"), ("compare", "--quiet")])
def test_an_option_a_command_ignores_is_caught(command: str, flag: str) -> None:
    parser = cli.build_parser()
    subparsers(parser)[command].add_argument(flag)
    assert flag.lstrip("-").replace("-", "_") in unused_options(parser)[command]


def test_no_command_offers_an_option_twice_or_none_at_all() -> None:
    for name, sub in subparsers(cli.build_parser()).items():
        strings = [s for a in sub._actions for s in a.option_strings]
        assert len(strings) == len(set(strings)), name
        for action in sub._actions:
            assert action.help, (name, action.dest)  # every option says what it does


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(tmp_path / "state"), "COLUMNS": "250"}  # help lines unwrapped
    return subprocess.run([sys.executable, "-m", "voice_llm", *args], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("value", ["inf", "1e300", "-inf", "nan", "0", "-5", "86401", "soon"])
@pytest.mark.parametrize("command, flag", [("sse", "--timeout"), ("sse", "--deadline"), ("lab", "--timeout"),
                                           ("cancel", "--deadline"), ("load", "--timeout")])
def test_out_of_range_seconds_are_one_usage_line(command: str, flag: str, value: str, tmp_path: Path) -> None:
    done = run(command, f"{flag}={value}", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert done.returncode == cli.EXIT_USAGE == 2
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"voice-llm {command}: error: argument {flag}: "), done.stderr
    assert value in error
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_seconds_accepts_what_a_request_can_wait() -> None:
    assert cli.seconds("0.5") == 0.5 and cli.seconds("86400") == 86400.0
    for bad in ("inf", "1e300", "nan", "0", "-1", "86400.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.seconds(bad)


def test_check_takes_out_as_a_flag_too(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    positional = run("check", str(out), tmp_path=tmp_path)
    flag = run("check", "--out", str(out), tmp_path=tmp_path)
    # an empty folder: nothing to check (tests/checks/test_check_nothing_to_check.py), said alike either way
    assert flag.returncode == positional.returncode == cli.EXIT_FAILURE
    assert flag.stderr == positional.stderr == f"voice-llm check: nothing to check in {out}: no step finished " \
        "there (no run.json, no step's file)\n" and flag.stdout == ""
    both = run("check", str(out), "--out", str(out), tmp_path=tmp_path)
    assert both.returncode == cli.EXIT_FAILURE and both.stderr == flag.stderr  # the same folder twice is the same
    other = run("check", str(out), "--out", str(tmp_path / "else"), tmp_path=tmp_path)
    assert other.returncode == cli.EXIT_FAILURE and "Traceback" not in other.stderr
    assert other.stderr.strip() == (f"voice-llm check: two folders given: OUT {out} and --out {tmp_path / 'else'}; "
                                    "give one")


def test_help_shows_defaults_and_only_what_the_command_has(tmp_path: Path) -> None:
    up = run("up", "--help", tmp_path=tmp_path).stdout
    assert "--url" not in up and "(default: 8080)" in up and "(default: 4096)" in up
    load = run("load", "--help", tmp_path=tmp_path).stdout
    # --callers' default is the mode's (text 1,2,4,8; --dial 1,2,3,4,6,8), said in its help
    for shown in ("(default 1,2,4,8;", "as it is, else 1,4)", "(default: 120.0)", "(default: 64)"):
        assert shown in load, shown
    # no --deadline or --repeat of its own (--dial-deadline is the dial callers' and says so)
    assert "[--deadline " not in load and "--repeat" not in load and "[--dial-deadline " in load
    report = run("report", "--help", tmp_path=tmp_path).stdout
    for absent in ("--url", "--repeat", "--timeout", "--deadline", "--model", "--port"):
        assert absent not in report, absent
    assert "--repeat" in run("prefill", "--help", tmp_path=tmp_path).stdout


def test_the_exit_codes_are_in_the_main_help(tmp_path: Path) -> None:
    text = run("--help", tmp_path=tmp_path).stdout
    section = text[text.index("exit status:"):]
    for code in (cli.EXIT_OK, cli.EXIT_FAILURE, cli.EXIT_USAGE, cli.EXIT_CHECKS_FAILED, cli.EXIT_REPORT_INCOMPLETE,
                 cli.EXIT_INTERRUPTED, cli.EXIT_BROKEN_PIPE):
        assert re.search(rf"^  {code}\s+\S", section, re.M), code
