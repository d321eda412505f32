"""load --dial's calls take dial's own settings as data (issue 42 item 3): `load` makes one DialOptions of its flags
(load.run.dial_caller), it travels to the master and the workers inside the sweep plan's JSON, and each call is
`voice-llm dial --settings FILE` with that DialOptions whole in FILE. Before, load.dialing.dial_command built the
call's argv by hand (--protocol, --deadline, --barge-in-turns, --think-ms, ...) from a DialConfig of load's own,
whose defaults (the line, the deadline) were copies of dial's.

The proof that a default of the call has one place: the source tree copied, dial's defaults changed in it, and the
call a load caller makes follows (as tests/agent/test_agent_settings.py proves it for the agent)."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from sourcecopy import SRC, changed_copy, run_script

from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load import dialing
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.run import dial_caller, plan_of, run_load
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.cli import main as cli
from voice_llm.core.errors import ConfigError
from voice_llm.core.run import flags

URL = "ws://127.0.0.1:18300/"
# What a call's command line may carry beside its settings file: where the run goes, no progress lines.
RUN_FLAGS = {"--settings", "--out", "--quiet", "-q", "--wait", "-h", "--help"}


def _dial_flags() -> set[str]:
    """Every flag `voice-llm dial` takes but the run's own: the call's settings as flags."""
    commands = next(action for action in cli.build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    dial = commands.choices["dial"]
    return {option for action in dial._actions for option in action.option_strings} - RUN_FLAGS


def _read_by_dial(command: list[str]) -> DialOptions:
    """What the call's `voice-llm dial` makes of its command line (``python -m voice_llm dial ...``)."""
    assert command[1:4] == ["-m", "voice_llm", "dial"], command
    parser = cli.build_parser()
    args = parser.parse_args(command[3:])
    cli._refuse_bad_options(parser, args)
    options: DialOptions = args.plugin_options["dial"]
    return options


def _worker_call(plan: SweepPlan) -> DialOptions:
    """The call a worker gets: the plan as the master reads it, its call as the master hands it to the workers
    (locust_users.dial_config)."""
    master = SweepPlan.from_json(plan.to_json())
    assert master.dial is not None
    return flags.build(DialOptions, flags.parse_settings(DialOptions, flags.settings_text(master.dial), "the plan"))


def test_a_load_callers_command_carries_no_dial_flag_and_its_file_reads_back_as_planned(tmp_path: Path) -> None:
    settings = LoadSettings(dial=URL, dial_turns=3, dial_barge_in_turns=(1,), dial_protocol="pcm",
                            dial_deadline_s=30.0, dial_lines="clinic")
    caller, planned, _ = dial_caller(settings)
    plan = plan_of(settings, caller, planned)
    assert plan.dial == planned and SweepPlan.from_json(plan.to_json()) == plan
    out = tmp_path / "call-1"
    out.mkdir()
    command = dialing.dial_command(_worker_call(plan), out, None)
    file = dialing.settings_file(out)
    assert command == [sys.executable, "-m", "voice_llm", "dial", "--settings", str(file), "--out", str(out),
                       "--quiet"]
    assert not set(command) & _dial_flags() and URL not in command  # nothing of the call on its command line
    read = _read_by_dial(command)
    assert read == planned  # the call dial makes is the one the plan said, whole
    assert (read.url, read.protocol, read.turns, read.barge_in_turns, read.deadline_s, read.caller_lines) == \
        (URL, "pcm", 3, (1,), 30.0, "clinic")
    assert (read.stt, read.think_ms, read.think_share) == ("none", 0.0, 0.1)  # load's own choices for a caller
    assert read.jitter_ms == DialOptions().jitter_ms  # the rest: dial's defaults

    # a later call says the lines the worker kept: the same call, its lines that folder, every WAV of it
    lines = tmp_path / "lines"
    later = _read_by_dial(dialing.dial_command(_worker_call(plan), tmp_path / "call-2", lines))
    assert later == replace(planned, caller_audio=lines, caller_lines=DialOptions.caller_lines, turns_given=False)
    assert later.barge_in_given  # the plan's barge-in turns, not the folder's


# In the copied tree: the call a load caller makes, from load's settings to what dial reads of its command line,
# and load's help, printed as JSON.
REACHES = r"""
import json, sys, tempfile
from pathlib import Path
from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load import dialing
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.run import dial_caller, plan_of
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.cli import main as cli
from voice_llm.core.run import flags

settings = LoadSettings(dial="ws://127.0.0.1:18300/")
caller, dial, _ = dial_caller(settings)
plan = SweepPlan.from_json(plan_of(settings, caller, dial).to_json())
handed = flags.build(DialOptions, flags.parse_settings(DialOptions, flags.settings_text(plan.dial), "the plan"))
out = Path(tempfile.mkdtemp()) / "call-1"
out.mkdir()
command = dialing.dial_command(handed, out, None)
parser = cli.build_parser()
args = parser.parse_args(command[3:])
cli._refuse_bad_options(parser, args)
load = next(action for action in parser._actions if action.dest == "command").choices["load"]
print(json.dumps({"call": flags.as_json(args.plugin_options["dial"]),
                  "load_help": {action.dest: action.help for action in load._actions}}))
"""


def test_a_default_changed_in_dial_reaches_the_load_callers_calls(tmp_path: Path) -> None:
    # one line each: the phone's jitter delay, the reply-end silence, the call's deadline, the line
    src = changed_copy(tmp_path, ("engines/line/playout.py", r"^DEFAULT_JITTER_MS = 40\b", "DEFAULT_JITTER_MS = 60"),
                       ("capabilities/dial/call.py", r"^REPLY_END_MS = 700\.0\b", "REPLY_END_MS = 650.0"),
                       ("capabilities/dial/call.py", r"^DEFAULT_DEADLINE_S = 60\.0\b", "DEFAULT_DEADLINE_S = 45.0"),
                       ("capabilities/dial/step.py", r"^(    protocol: str = setting\()wire\.TWILIO\b", r"\1wire.PCM"))
    found = run_script(src, REACHES)
    call = found["call"]
    assert (call["jitter_ms"], call["reply_end_ms"], call["deadline_s"], call["protocol"]) == (60, 650, 45, "pcm")
    assert "(default: 45.0)" in found["load_help"]["dial_deadline"]  # load's flags for the call: dial's defaults
    assert "(default pcm)" in found["load_help"]["dial_protocol"]


def test_the_unchanged_tree_says_its_own_defaults() -> None:
    """The same script on the tree as it is (so the copy's numbers above are the edit's, not the script's)."""
    found = run_script(SRC, REACHES)
    call = found["call"]
    assert (call["jitter_ms"], call["reply_end_ms"], call["deadline_s"], call["protocol"]) == \
        (40, 700, 60, "twilio")
    assert "(default: 60.0)" in found["load_help"]["dial_deadline"]
    assert "(default twilio)" in found["load_help"]["dial_protocol"]


@pytest.mark.parametrize("given, says", [
    # dial's own waits are longer than such a deadline: every call would exit 2
    ({"dial_deadline_s": 0.5}, "--dial: every call would be refused: --reply-end-ms waits 0.7 s, longer than "
                               "--deadline 0.5 s"),
    ({"dial": "ws://127.0.0.1:0/"}, "--dial: every call would be refused: port 0 in 'ws://127.0.0.1:0/'"),
])
def test_a_call_dial_would_refuse_is_refused_by_load_before_anything_starts(tmp_path: Path, given: dict,
                                                                           says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        run_load(LoadSettings(out=tmp_path / "out", **{"dial": URL, **given}))
    assert not (tmp_path / "out").exists()
