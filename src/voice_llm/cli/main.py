"""The `voice-llm` command. Thin: parse flags, call the library, turn its exceptions into one clear line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from voice_llm import __version__

from voice_llm.core import registry
from voice_llm.core.server import lifecycle as server, provision
from voice_llm.core.run import flags
from voice_llm.core.run.flags import MAX_SECONDS, port_number, positive_int, seconds
from voice_llm.core.analysis import keynumbers, noise
from voice_llm.core.analysis.compare import compare_runs, summary_lines
from voice_llm.core.lab import LabResult, LabSettings, run_lab, run_steps
from voice_llm.core.lab.report import findings
from voice_llm.core.lab.summary import step_numbers
from voice_llm.core.report.capability_table import read_capability_rows
from voice_llm.core.report.compare_page import render_compare
from voice_llm.core.run import meta as runmeta, session
from voice_llm.core.checks.core import FAIL, CheckResult, run_checks
from voice_llm.core.checks.core import counts as check_counts
from voice_llm.core.util.artifacts import COMPARE_HTML, REPORT, dumps_json, read_json
from voice_llm.core.server.config import DEFAULT_PORT, ServerSettings, api_key_from_env, default_out_dir
from voice_llm.core.errors import (EXIT_BROKEN_PIPE, EXIT_CHECKS_FAILED, EXIT_FAILURE, EXIT_INTERRUPTED,  # noqa: F401
                              EXIT_NO_VERDICT, EXIT_OK, EXIT_REPORT_INCOMPLETE, EXIT_USAGE, ArtifactError,
                              ConfigError, ReportIncompleteError, VoiceLLMError, exit_table_text)
from voice_llm.core.run.context import StepOptions
from voice_llm.core.lab.steps import steps as registered_steps
from voice_llm.core.run.lock import writer_of
from voice_llm.core.util.progress import Progress, make_progress
from voice_llm.core.sse import StreamError


# The exit statuses: one table for every command (voice_llm.core.errors), re-exported here for the tests and callers.
EXIT_CODES_HELP = exit_table_text()


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help line ("(default: ...)") unless the help already says it; the epilog's
    line breaks kept (the exit codes)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == argparse.SUPPRESS or "default" in text
                or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


# The core steps that repeat their measurement (StepOptions.repeat); a capability's step takes --repeat from its
# own cli= function (tts: speak).
_REPEATED_STEPS = frozenset({"prefill", "cache", "sentence", "cancel"})


class _CommandParser(argparse.ArgumentParser):
    """Every command's parser shows its defaults (also a command a capability adds through the registry)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def _capability_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags the registered capabilities add to ``command`` (voice_llm.core.registry, ``Capability.cli``)."""
    for capability in registry.capabilities():
        if capability.cli:
            registry.resolve(capability.cli)(parser, command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voice-llm",
        description="When does the caller hear the assistant after they stop talking, measured at the caller's ear "
                    "on a real line, and how much of it is the llama.cpp server's first token and first sentence? "
                    "Start the server, measure, save the evidence, check and report it.",
        epilog=EXIT_CODES_HELP, formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"voice-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text)

    fetched = [c.installs for c in registry.capabilities() if c.install and c.installs]
    p = command("install", "build llama-server and fetch the default model" +
                " (cached)" + "".join(f"; {what}" for what in fetched))
    p.add_argument("--model", help=flags.MODEL_FILE_HELP)
    p.add_argument("--server-bin", help=flags.SERVER_BIN_HELP)
    flags.quiet_option(p)

    p = command("up", "start the managed llama-server and wait until it is ready")
    flags.server_options(p, with_url=False)
    flags.api_key_option(p)
    flags.quiet_option(p)
    p.add_argument("--restart", action="store_true",
                   help="if a server runs on --port with other settings, restart it with these")

    p = command("status", "which managed servers run, and what they serve")
    p.add_argument("--port", type=port_number, help="only this port, and say what answers there (default: every managed server)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    flags.api_key_option(p)

    p = command("log", "the managed server's log")
    p.add_argument("--port", type=port_number, help="the managed server on this port (default: the only managed server)")
    p.add_argument("-n", "--lines", type=positive_int, default=40, help="the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing lines as the server writes them")

    p = command("down", "stop the managed server")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--port", type=port_number, help="the managed server on this port (default: the only managed server)")
    which.add_argument("--all", action="store_true", help="stop every managed server")

    p = command("lab", "run every step of the brief, write the artifacts, report and check them")
    flags.server_options(p, with_url=True)
    flags.out_option(p)
    flags.request_options(p)
    flags.kb_option(p)
    flags.repeat_option(p)
    flags.wait_option(p)
    flags.api_key_option(p)
    flags.quiet_option(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--restart", action="store_true",
                   help="if the managed server on --port runs with other settings, restart it with these")
    _capability_flags(p, "lab")

    for name, step in registered_steps().items():
        # A step `voice-llm lab` runs says so; one it does not (call) is a step of its own, run only when asked.
        p = command(name, f"{'lab step' if step.in_lab else 'step, not in the lab'}: {step.title}")
        flags.out_option(p, default_out_dir(step.out_dir))
        if step.needs_server:
            flags.request_options(p)
            p.add_argument("--port", type=port_number, help="port of the managed server (default: the only one running)")
            p.add_argument("--model", help="model name sent in each request (default: the first id of /v1/models)")
            flags.api_key_option(p)
            flags.new_run_option(p)
        if step.reads_kb:
            flags.kb_option(p)
        if name in _REPEATED_STEPS:
            flags.repeat_option(p)
        _capability_flags(p, name)
        flags.wait_option(p)
        flags.quiet_option(p)
        if name == "report":
            p.add_argument("--compare", type=Path, metavar="OUT_B",
                           help="no measuring: write OUT/compare.html with this run and the run in OUT_B, from files")
            p.add_argument("--force", action="store_true", help="with --compare: even runs of different prompts or KB")

    # Whole commands a capability adds (agent, load): each sets settings_of(values) -> its settings, and its handler,
    # run_command(settings, progress) -> exit status.
    for capability in registry.capabilities():
        if capability.commands:
            registry.resolve(capability.commands)(sub)

    p = command("check", "verify the artifacts against each other, from the files alone")
    p.add_argument("out_positional", nargs="?", type=Path, metavar="OUT", help="the artifact folder (or --out)")
    p.add_argument("--out", type=Path, help=f"the artifact folder, as OUT (default: {default_out_dir()})")

    p = command("compare", "two runs side by side: every metric, B/A, and whether it is beyond the noise")
    p.add_argument("out_a", type=Path, metavar="OUT_A", help="the run to compare against")
    p.add_argument("out_b", type=Path, metavar="OUT_B", help="the run compared with it (B/A)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--force", action="store_true", help="compare even runs of different prompts or documents")
    p.add_argument("--html", action="store_true", help=f"also write both runs on one page: OUT_A/{COMPARE_HTML}")

    parser.command_names = frozenset(sub.choices)  # type: ignore[attr-defined]  # what main() tells apart
    return parser


def _settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host, port=args.port, ctx=args.ctx, slots=args.slots, threads=args.threads,
        api_key=api_key_from_env(args.api_key), allow_remote=args.allow_remote,
    )


def cmd_install(args: argparse.Namespace, progress: Progress) -> int:
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    lines = [f"llama-server: {binary}", f"model: {model}"]
    for capability in registry.capabilities():  # what each capability fetches (tts: the default voice, verified)
        if capability.install:
            said = registry.resolve(capability.install)()
            if said:
                lines.append(said)
    print("\n".join(lines))
    return EXIT_OK


class _SaidByTheResult:
    """`up`'s progress, without the line that ends the server's start: `up` prints that result itself, on stdout
    (session.started_line, with the log's path), so it is said once. Every other step (a build, a download, the
    stop before a restart) ends with its own line as before."""

    SERVER_START = "Starting llama-server"  # the title voice_llm.core.server.lifecycle.start gives the start

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._title = ""

    def start(self, title: str, total: float | None = None) -> None:
        self._title = title
        self._progress.start(title, total)

    def update(self, detail: str, completed: float | None = None) -> None:
        self._progress.update(detail, completed)

    def finish(self, summary: str) -> None:
        if self._title.startswith(self.SERVER_START):
            self.finish_if_open()
        else:
            self._progress.finish(summary)

    def note(self, line: str) -> None:
        self._progress.note(line)

    def finish_if_open(self) -> None:
        getattr(self._progress, "finish_if_open", lambda: None)()


def cmd_up(args: argparse.Namespace, progress: Progress) -> int:
    started = session.bring_up(_settings(args), args.server_bin, args.model, _SaidByTheResult(progress),
                               restart=args.restart)
    print(session.started_line(started))
    if started.previous_death:
        kept = f"; its log is kept in {started.previous_log}" if started.previous_log else ""
        print(f"note: the previous {started.previous_death}{kept}", file=sys.stderr)
    return EXIT_OK


def _said(value: object) -> str:
    """A value the server reports, or "not said" when it did not (never "None")."""
    return "not said" if value is None else str(value)


def _ctx_text(n_ctx: int | None, slots: int | None) -> str:
    """llama-server's /props n_ctx is the context of ONE slot (``-c`` split over ``-np``): said per slot, with the
    total over the slots when the server says how many it has, so `up --slots 4 --ctx 16384` does not read as 4096."""
    if n_ctx is None or not slots:
        return f"n_ctx: {_said(n_ctx)}  total_slots: {_said(slots)}"
    return f"n_ctx: {n_ctx} per slot ({n_ctx * slots} over {slots} slot{'s' if slots != 1 else ''})"


def _status_text(st: server.ServerStatus) -> str:
    if not st.running:
        return f"not running ({st.url}){' - ' + st.note if st.note else ''}"
    return (f"running: {st.url} pid {st.pid}, up {st.uptime_s:.0f} s\nmodel: {st.model}\n"
            f"health: {json.dumps(st.health)}  {_ctx_text(st.n_ctx, st.total_slots)}\nlog: {st.log}"
            + (f"\nnote: {st.note}" if st.note else ""))


def cmd_status(args: argparse.Namespace, progress: Progress) -> int:
    key = api_key_from_env(args.api_key)
    if args.port is not None:  # this port: also what answers there when voice-llm has no record of it
        every = [server.status(ServerSettings(port=args.port, api_key=key))]
    else:
        every = server.statuses(key)
    if args.json:
        shown = every[0].as_dict() if args.port is not None else [st.as_dict() for st in every]
        print(dumps_json(shown), end="")
    elif args.port is not None:
        print(_status_text(every[0]))
    elif not every:
        print("no managed llama-server (start one with `voice-llm up`)")
    else:
        print("\n\n".join(f"port {st.port}: " + _status_text(st) for st in every))
    return 0 if any(st.running for st in every) else EXIT_FAILURE


def cmd_log(args: argparse.Namespace, progress: Progress) -> int:
    port = server.resolve_log_port(args.port)
    try:
        for line in server.follow_log(port, args.lines, follow=args.follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:  # how `log -f` ends, as `tail -f` does: 130 like every interrupted command, no line
        return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_down(args: argparse.Namespace, progress: Progress) -> int:
    if args.all:
        said = server.down_all()
        print("\n".join(said) if said else "no managed server")
        return EXIT_OK
    if args.port is None and not server.running_ports():
        print("no managed server is running")
        return EXIT_OK
    print(server.down(server.resolve_port(args.port)))
    return EXIT_OK


def _print_findings(out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    # The caller's number first, above the tables (issue 42 item 7), in the sentence report.html leads with.
    print(_caller_sentence(out) or "The caller's number (mouth to ear) cannot be read: `voice-llm check` says why.")
    table = Table(title=f"voice-llm lab — {out}", show_lines=False)
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("what it means for a voice prompt")
    for finding in findings(out):
        table.add_row(finding.label, finding.value, finding.meaning)
    Console().print(table)
    try:
        rows = read_capability_rows(out)
    except ArtifactError as exc:  # the measurements above stand; the table of what the server exposed cannot be shown
        print(f"server capabilities not shown: {exc}", file=sys.stderr)
        rows = None
    if rows:
        caps = Table(title="what this server exposed", show_lines=False)
        for column in ("probed", "found", "the lab's numbers rest on"):
            caps.add_column(column)
        for row in rows:
            caps.add_row(*row)
        Console().print(caps)


def _caller_sentence(out: Path, step: str | None = None) -> str | None:
    """The headline sentence for ``out`` (voice_llm.core.analysis.keynumbers.headline), or for a lone ``step`` only when
    that step wrote the artifact it is read from; None when it cannot be read (the tables below still print)."""
    try:
        caller = keynumbers.headline(out)
    except (ArtifactError, OSError, ValueError):
        return None
    if step is not None and (caller.source is None or caller.source not in registered_steps()[step].artifacts):
        return None
    return caller.sentence()


def _print_step_numbers(out: Path, step: str) -> None:
    """A step alone: its key numbers, one short table as the lab's summary (voice_llm.core.lab.summary)."""
    rows = step_numbers(out, step)
    if _caller_sentence(out, step):
        print(_caller_sentence(out, step))  # a step that measures the caller's number (converse, dial) says it first
    if not rows:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"voice-llm {step} — {out}", show_lines=False)
    table.add_column("measured")
    table.add_column("value", justify="right")
    for label, value in rows:
        table.add_row(label, value)
    Console().print(table)


def _print_noise(out: Path, file: TextIO) -> None:
    for line in noise.summary_lines(noise.assess(out)):
        print(line, file=file)


def _print_checks(results: Sequence[CheckResult], file: TextIO | None = None) -> bool:
    """Each result with its numbers, then the counts; True unless one FAILed (findings do not fail a run)."""
    for result in results:
        print(f"{result.label:4}  {result.name}: {result.detail}", file=file)
    print(check_counts(results), file=file)
    return not any(r.status == FAIL for r in results)


def _lab_settings(args: argparse.Namespace, command: str) -> LabSettings:
    """The run's settings for ``command``: "lab" (it starts the server, or finds it running, on --port) or one
    step's name. A step is offered only the flags it uses (build_parser): the others keep StepOptions' defaults."""
    url, port = getattr(args, "url", None), getattr(args, "port", None)
    lab = command == "lab"
    if lab:  # the server it starts, or finds running, on --port (with the lab's --ctx, --slots, ...)
        server_settings = _settings(args)
    elif url or not registered_steps()[command].needs_server or port is not None:
        server_settings = ServerSettings(port=port or DEFAULT_PORT)
    else:  # a step with no --port or --url: the only managed server running
        server_settings = ServerSettings(port=server.resolve_port(None))
    model = getattr(args, "model", None)
    return LabSettings(
        out=args.out.expanduser(), kb_dir=getattr(args, "kb", None), url=url, server=server_settings,
        server_bin=getattr(args, "server_bin", None), model=model,
        # --model names the GGUF the lab starts; with --url (or for a step alone) it is the model name sent.
        request_model=model if url or not lab else None,
        api_key=api_key_from_env(getattr(args, "api_key", None)), wait_for_out=args.wait,
        restart_server=getattr(args, "restart", False), new_run=getattr(args, "new_run", False),
        options=StepOptions(repeat=getattr(args, "repeat", StepOptions.repeat),
                            timeout=getattr(args, "timeout", StepOptions.timeout),
                            deadline_s=getattr(args, "deadline", StepOptions.deadline_s),
                            plugins=getattr(args, "plugin_options", None) or _plugin_options(args)),
    )


def _plugin_options(args: argparse.Namespace) -> dict[str, object]:
    """Each capability's options value from the flags (voice_llm.core.registry, ``Capability.options``)."""
    values = vars(args)
    return {c.name: registry.resolve(c.options)(values) for c in registry.capabilities() if c.options}


def cmd_lab(args: argparse.Namespace, progress: Progress) -> int:
    # With --json, stdout carries report.json alone; everything else a person reads goes to stderr.
    text = sys.stderr if args.json else sys.stdout
    settings = _lab_settings(args, "lab")
    incomplete: ReportIncompleteError | None = None
    try:
        result = run_lab(settings, progress, notify=lambda line: print(line, file=text))
    except ReportIncompleteError as exc:  # every step measured and saved; only a section of the page is missing
        getattr(progress, "finish_if_open", lambda: None)()
        incomplete = exc
        result = _saved_lab_result(settings.out, exc)
    if args.json:
        print(dumps_json(read_json(result.out / REPORT)), end="")
    else:
        _print_findings(result.out)
    _print_noise(result.out, text)
    ratio = result.run.get("wall_over_compute")
    if ratio:
        print(f"lab wall {result.run['wall_ms'] / 1000:.1f} s vs server compute "
              f"{result.run['server_compute_ms'] / 1000:.1f} s ({ratio:.3f}x); run {result.run.get('run_id')}", file=text)
    if result.report_html:
        print(f"report: {result.report_html}", file=text)
    passed = _print_checks(result.checks, text)
    if incomplete is not None:  # after the summary, in one line; a failed check still says more than the page
        print(f"voice-llm lab: {_describe(incomplete)}", file=sys.stderr)
        return EXIT_REPORT_INCOMPLETE if passed else EXIT_CHECKS_FAILED
    return 0 if passed else EXIT_CHECKS_FAILED


def _saved_lab_result(out: Path, exc: ReportIncompleteError) -> LabResult:
    """What run_lab would have returned, read back from the files it saved before drawing the page."""
    record = runmeta.RunRecord.load(out)
    return LabResult(out, record.doc if record else {}, (), tuple(run_checks(out)), Path(str(exc.path)))


def cmd_step(args: argparse.Namespace, progress: Progress) -> int:
    if getattr(args, "compare", None) is not None:
        return cmd_report_compare(args)

    result = run_steps(_lab_settings(args, args.command), [args.command], progress, notify=lambda line: print(line, file=sys.stderr))
    _print_step_numbers(result.out, args.command)
    for path in result.written:
        print(path)
    if result.report_html:
        print(f"report: {result.report_html}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace, progress: Progress) -> int:
    comparison = compare_runs(args.out_a.expanduser(), args.out_b.expanduser(), force=args.force)
    if args.json:
        print(dumps_json(comparison.as_dict()), end="")
    else:
        print("\n".join(summary_lines(comparison)))
    if args.html:  # the page after the text, as `report --compare` writes it (stderr under --json: stdout is JSON)
        print(f"report: {render_compare(comparison)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def cmd_report_compare(args: argparse.Namespace) -> int:
    comparison = compare_runs(args.out.expanduser(), args.compare.expanduser(), force=args.force)
    print(f"report: {render_compare(comparison)}")
    return EXIT_OK


def _check_out(args: argparse.Namespace) -> Path:
    """check's folder: OUT or --out (the same meaning, as every other command spells it); both must agree."""
    given = [path for path in (args.out_positional, args.out) if path is not None]
    if len(given) == 2 and given[0].expanduser() != given[1].expanduser():
        raise ConfigError(f"two folders given: OUT {given[0]} and --out {given[1]}; give one")
    return (given[0] if given else default_out_dir()).expanduser()


def cmd_check(args: argparse.Namespace, progress: Progress) -> int:
    out = _check_out(args)
    writer = writer_of(out)
    if writer is not None:  # its files are half this run's: checking them now would fail what is not finished
        raise ArtifactError(f"{out} is being written by {writer}; run check when it has finished")
    return 0 if _print_checks(run_checks(out)) else EXIT_CHECKS_FAILED


def cmd_capability(args: argparse.Namespace, progress: Progress) -> int:
    """A command a capability added (agent, load): its handler takes the settings its ``settings_of`` made of the
    parsed flags (_refuse_bad_options), never argparse."""
    return args.run_command(args.command_settings, progress)


COMMANDS = {
    "install": cmd_install, "up": cmd_up, "status": cmd_status, "log": cmd_log, "down": cmd_down,
    "lab": cmd_lab, "check": cmd_check, "compare": cmd_compare,
}


def _describe(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return " ".join([str(exc), *(f"({note})" for note in notes)])


def _managed_server_death(args: argparse.Namespace, exc: BaseException) -> str | None:
    """A stream that broke off from the managed server: if its process is gone, that is the cause to name."""
    if not isinstance(exc, StreamError) or getattr(args, "url", None):
        return None
    try:
        port = server.resolve_port(getattr(args, "port", None))
    except VoiceLLMError:
        return None
    return server.explain_death(port)


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    # `timeout`, `kill` and service managers send SIGTERM: stop as cleanly as on Ctrl-C (temp files removed,
    # complete files kept, one line on stderr).
    raise KeyboardInterrupt


def _stdout_closed() -> int:
    """The reader of stdout went away (`voice-llm compare A B | head -2`): not an error of ours. Say nothing, point
    stdout at /dev/null so the interpreter's last flush cannot fail again, and exit 141 (128 + SIGPIPE), the status
    a shell shows for `yes | head`, so `set -o pipefail` still sees that the output was cut."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout file descriptor (captured in-process): nothing to redirect
        pass
    return EXIT_BROKEN_PIPE


def _without_refused() -> str | None:
    """One line when VOICE_LLM_WITHOUT names something that is no capability (a typo would otherwise leave
    nothing out without a word)."""
    unknown = registry.unknown_without()
    if not unknown:
        return None
    known = [c.name for c in registry.registered()]
    close = {name: next((k for k in known if k.lower() == name.lower().strip()), None) for name in unknown}
    hints = "".join(f"; did you mean {match!r}?" for match in close.values() if match)
    return (f"voice-llm: {registry.WITHOUT_ENV} names no capability: {', '.join(map(repr, unknown))} "
            f"(the capabilities: {', '.join(known)}){hints}")


def _left_out_command(parser: argparse.ArgumentParser, command: str) -> str | None:
    """Why ``command`` is not offered, when it is a step or command of a capability left out (VOICE_LLM_WITHOUT,
    or one it requires left out): said in one line instead of argparse's "invalid choice"."""
    out = registry.left_out()
    if not out or command in getattr(parser, "command_names", ()):
        return None
    for capability in registry.registered():
        if capability.name not in out:
            continue
        names = {step.name for step in capability.steps}
        if capability.commands:  # the commands it would add, on a parser thrown away
            probe = argparse.ArgumentParser().add_subparsers(parser_class=_CommandParser)
            registry.resolve(capability.commands)(probe)
            names |= set(probe.choices)
        if command in names:
            env = os.environ.get(registry.WITHOUT_ENV)
            given = f" ({registry.WITHOUT_ENV}={env})" if env else ""
            return f"voice-llm {command}: not available: {out[capability.name]}{given}"
    return None


def _refuse_bad_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The capabilities' options, and the settings of a command a capability adds (its ``settings_of``), built
    once from the parsed flags, before anything starts: a value their rules refuse (dial's --rate 1 on a PCM line,
    --codec pcm16 on a Twilio line, an http:// agent URL, the agent's --max-tokens 5000) is a bad flag value like any
    argparse refuses, the table's usage status (2) with one line, not a run's error (1). Kept on ``args`` for the
    handler (``plugin_options``, ``command_settings``), so each value is made, and its rules checked, once."""
    try:
        args.plugin_options = _plugin_options(args)
        settings_of = getattr(args, "settings_of", None)
        args.command_settings = settings_of(vars(args)) if settings_of is not None else None
    except ConfigError as exc:
        sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        sub.choices[args.command].error(str(exc))  # exits EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    refused = _without_refused()
    if refused:
        print(refused, file=sys.stderr)
        return EXIT_USAGE
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    reason = _left_out_command(parser, argv[0]) if argv and not argv[0].startswith("-") else None
    if reason:
        print(reason, file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    _refuse_bad_options(parser, args)
    progress = make_progress(getattr(args, "quiet", False))
    handler = COMMANDS.get(args.command) or (cmd_capability if hasattr(args, "run_command") else cmd_step)
    try:
        status = handler(args, progress)
        sys.stdout.flush()  # a reader that closed the pipe is found here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except ReportIncompleteError as exc:  # the measurements are saved; only the page lacks a section
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: {_describe(exc)}", file=sys.stderr)
        return EXIT_REPORT_INCOMPLETE
    except (VoiceLLMError, StreamError) as exc:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: {_describe(exc)}", file=sys.stderr)
        death = _managed_server_death(args, exc)
        if death:
            print(f"cause: {death}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # the machine said no (a folder that is a file, no space, no permission): one line
        getattr(progress, "finish_if_open", lambda: None)()
        where = f": {exc.filename}" if exc.filename else ""
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", []))  # the step it happened in
        print(f"voice-llm {args.command}: {exc.strerror or exc}{where}{notes}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: interrupted; files already written are complete and kept", file=sys.stderr)
        return EXIT_INTERRUPTED
