"""Settings as data (issue 42 item 3): a settings dataclass declares each setting once (voice_llm.core.run.flags.
setting: default, help, flag, rule), and everything else is derived from that one declaration: the flags (names,
metavars, the choices shown, the default in the help), the settings from the parsed flags, the check of every
rule (once, when the value is made), and the JSON a setting crosses a process in."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from voice_llm.core.errors import ConfigError
from voice_llm.core.run import flags
from voice_llm.core.run.flags import Between, OneOf, Satisfies, setting


@dataclass(frozen=True)
class Voice:
    pitch: float = setting(1.0, metavar="X", rule=Between(0, 4), help="how high (default {default})")

    def __post_init__(self) -> None:
        flags.check(self)


@dataclass(frozen=True)
class Sample:
    """A settings class as a capability writes one."""

    colour: str = setting("red", rule=OneOf(("red", "green")), help="what colour (default {default})")
    count: int = setting(3, metavar="N", rule=Between(1, 9), help="how many")
    delay_ms: float | None = setting(None, name="--delay", metavar="MS", rule=Between(0, above=True),
                                     help="how long to wait (default: none)")
    where: Path | None = setting(None, metavar="DIR", help="where to look")
    loud: bool = setting(True, help="speak up (default {default})")
    verbose: bool = setting(False, switch="on", help="say more")
    prime: bool = setting(True, name="--no-prime", switch="off", help="do not prime")
    url: str = setting("http://x:1", rule=Satisfies(lambda u: None if u.startswith("http") else "not http", "a URL"),
                       help="whom to ask")
    token: str | None = setting(None, secret=True, help="a secret")
    voice: Voice = setting(default_factory=Voice, help="the voice's own settings")
    turns: tuple[int, ...] = setting((1, 2), metavar="LIST", parse=lambda text: tuple(map(int, text.split(","))),
                                     help="which turns")
    kept: int = 7  # not a setting with a flag: carried, never offered

    def __post_init__(self) -> None:
        flags.check(self)


SAMPLE_FLAGS = flags.flags_of(Sample)


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="sample", exit_on_error=False)
    SAMPLE_FLAGS.add(made)
    return made


def test_the_flags_are_derived_from_the_declarations() -> None:
    made = parser()
    by_dest = {action.dest: action for action in made._actions}
    assert by_dest["colour"].metavar == "{red,green}" and by_dest["colour"].option_strings == ["--colour"]
    assert by_dest["delay"].option_strings == ["--delay"] and by_dest["delay"].metavar == "MS"
    assert by_dest["loud"].option_strings == ["--loud", "--no-loud"]
    assert by_dest["no_prime"].option_strings == ["--no-prime"]
    assert by_dest["pitch"].option_strings == ["--pitch"]  # a nested settings value's flags, where it stands
    assert "kept" not in by_dest and "token" in by_dest
    # the help shows the declared default, the one place it is written
    assert by_dest["colour"].help == "what colour (default red)"
    assert by_dest["count"].help == "how many (default: 3)"  # as the CLI's formatter says any other default
    assert by_dest["loud"].help == "speak up (default on)" and by_dest["pitch"].help == "how high (default 1)"
    assert by_dest["verbose"].help == "say more" and by_dest["no_prime"].help == "do not prime"
    # every argparse default is None: a flag given is told from one left out
    assert all(action.default is None for action in made._actions if action.dest != "help")


def test_the_settings_are_the_defaults_and_the_flags_given() -> None:
    values = vars(parser().parse_args(["--count", "4", "--no-loud", "--verbose", "--no-prime", "--pitch", "2",
                                       "--where", "~/x", "--turns", "3,4"]))
    made = flags.build(Sample, SAMPLE_FLAGS.given(values))
    assert made == Sample(count=4, loud=False, verbose=True, prime=False, voice=Voice(pitch=2.0),
                          where=Path("~/x").expanduser(), turns=(3, 4))
    assert flags.build(Sample, SAMPLE_FLAGS.given(vars(parser().parse_args([])))) == Sample()


REFUSED = {  # a flag and its value -> the one line that refuses it
    "--colour blue": "--colour must be one of red, green, not 'blue'",
    "--count 10": "--count must be 1-9, not 10",
    "--delay 0": "--delay must be more than 0, not 0",
    "--pitch 5": "--pitch must be 0-4, not 5",
    "--url ftp://x": "--url: not http",
}


@pytest.mark.parametrize("given", sorted(REFUSED))
def test_a_refused_value_names_its_flag_and_its_rule(given: str) -> None:
    with pytest.raises(ConfigError) as refused:
        flags.build(Sample, SAMPLE_FLAGS.given(vars(parser().parse_args(given.split()))))
    assert str(refused.value) == REFUSED[given]
    with pytest.raises(ConfigError):  # the same rule for a value made in Python: it is the settings' own
        Sample(**{"count": 10} if given.startswith("--count") else {"colour": "blue"})


@pytest.mark.parametrize("text", ["soon", "inf", "nan"])
def test_a_number_flag_takes_a_finite_number(text: str) -> None:
    with pytest.raises(argparse.ArgumentError):
        parser().parse_args(["--delay", text])


def test_a_flag_renamed_for_one_command_is_the_same_setting() -> None:
    renamed = flags.flags_of(Sample, ("count",), count="--how-many")
    made = argparse.ArgumentParser()
    renamed.add(made)
    assert renamed.given(vars(made.parse_args(["--how-many", "5"]))) == {"count": 5}
    with pytest.raises(TypeError):  # a setting no one declared
        flags.flags_of(Sample, ("colour", "nope"))


def test_the_json_of_a_settings_value_reads_back_the_same_value() -> None:
    value = Sample(colour="green", count=2, delay_ms=5.0, where=Path("/tmp/w"), token="s3cret",
                   voice=Voice(pitch=3.0), turns=(2,), kept=8)
    data = json.loads(json.dumps(flags.as_json(value)))
    assert "token" not in data  # a secret is never written
    assert data["voice"] == {"pitch": 3.0} and data["turns"] == [2] and data["where"] == "/tmp/w"
    read = flags.from_json(Sample, data, "the file")
    assert flags.build(Sample, read, {"token": "s3cret"}) == value
    # a later layer wins field by field, also inside a nested settings value
    assert flags.build(Sample, read, {"voice": {"pitch": 1.5}, "count": 9}) == \
        Sample(colour="green", count=9, delay_ms=5.0, where=Path("/tmp/w"), voice=Voice(pitch=1.5), turns=(2,),
               kept=8)


@pytest.mark.parametrize("data, says", [
    ({"colours": "red"}, "no such setting 'colours'"),
    ({"count": "3"}, "count must be a whole number, not '3'"),
    ({"count": True}, "count must be a whole number, not True"),
    ({"delay_ms": "x"}, "delay_ms must be a number or null, not 'x'"),
    ({"token": "s3cret"}, "token is not read from a file"),
    ({"voice": {"pitch": "high"}}, "pitch must be a number, not 'high'"),
    ([1, 2], "must hold a JSON object"),
])
def test_a_settings_file_that_is_not_the_settings_is_one_line(data: object, says: str) -> None:
    with pytest.raises(ConfigError, match="the file") as refused:
        flags.from_json(Sample, data, "the file")
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_settings_file_is_read_or_refused_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"count": 5}))
    assert flags.read_settings(Sample, good) == {"count": 5}
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for file, says in ((broken, "is not valid JSON"), (tmp_path / "none.json", "cannot read")):
        with pytest.raises(ConfigError, match=says):
            flags.read_settings(Sample, file)


def test_a_rule_says_what_it_takes() -> None:
    assert Between(0, 1000, unit="ms").describe() == "0-1000 ms"
    assert Between(0, above=True).describe() == "more than 0"
    assert Between(1).describe() == "at least 1" and Between(0).describe() == "0 or more"
    assert flags.SECONDS.describe() == "more than 0 and at most 86400 seconds"
    assert Between(0, 10).refusal(float("inf")) == "must be 0-10, not inf"
    steps = flags.Each(Between(1), some=True)
    assert steps.refusal((1, 2)) is None and steps.refusal((2, 0)) == "must be at least 1, not 0 (in 2,0)"
    assert steps.refusal(()) == "must name one number or more, not none" and flags.Each(Between(1)).refusal(()) is None


def test_a_list_flag_is_whole_numbers_or_none() -> None:
    assert flags.whole_list("1, 3") == (1, 3) and flags.whole_list("none") == () == flags.whole_list("")
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated"):
        flags.whole_list("1,x")


@dataclass(frozen=True)
class Undeclared:
    mood: list[str] = setting(default_factory=list, help="a type with no parse of its own")


def test_a_setting_whose_type_says_no_parse_must_declare_one() -> None:
    with pytest.raises(TypeError, match="declares its parse"):
        flags.flags_of(Undeclared).add(argparse.ArgumentParser())


def test_a_field_without_a_declaration_is_no_flag() -> None:
    @dataclass(frozen=True)
    class Plain:
        size: int = field(default=1)

    assert flags.flags_of(Plain).names() == ()
