"""The exceptions of voice-llm. The CLI turns each into one line on stderr and a non-zero exit.

Stream errors live in :mod:`voice_llm.core.sse` (which must stand alone, standard library only); everything else is
a :class:`VoiceLLMError`.
"""

from __future__ import annotations

from dataclasses import dataclass


# -- The exit status of every command -------------------------------------------------------------------------
# One table for the whole CLI (cli/main.py and every capability's command, `load` included, return these names):
# each code has one meaning. `voice-llm --help` prints EXIT_TABLE as its epilog and docs/guarantees.md "Exit status"
# lists the same lines (tests/cli/test_exit_table.py holds the three together).

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # argparse's own status for a bad flag or value
EXIT_CHECKS_FAILED = 3
EXIT_REPORT_INCOMPLETE = 4  # measured and saved, but a section of report.html (or compare.html) could not be drawn
EXIT_NO_VERDICT = 5  # `load`: measured and saved, but a sweep reached no verdict (too few judged turns)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 141  # stdout was closed by the reader (`| head`): 128 + SIGPIPE, as `yes | head` ends


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str


EXIT_TABLE: tuple[ExitCode, ...] = (
    ExitCode(EXIT_OK, "done (`check`, `lab`: no check failed; findings do not fail; `load`: every sweep has a verdict)"),
    ExitCode(EXIT_FAILURE, "an error, said in one line on stderr (`status`: no managed server runs)"),
    ExitCode(EXIT_USAGE, "a bad flag or flag value, refused before anything starts (usage on stderr)"),
    ExitCode(EXIT_CHECKS_FAILED, "a check failed (`check`, `lab`; the artifacts are kept)"),
    ExitCode(EXIT_REPORT_INCOMPLETE, "measured and saved, but a section of report.html or compare.html could not be drawn"),
    ExitCode(EXIT_NO_VERDICT, "`load`: measured and saved, but a sweep has no verdict (the line says how to get one)"),
    ExitCode(EXIT_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); files already written are complete and kept"),
    ExitCode(EXIT_BROKEN_PIPE, "stdout was closed before everything was printed (`| head`); nothing else is affected"),
)


def exit_table_text() -> str:
    """The table as `--help` prints it (and docs/guarantees.md quotes it)."""
    lines = [f"  {entry.code:<4} {entry.meaning}" for entry in EXIT_TABLE]
    return "\n".join(["exit status:", *lines, "  `load --worker` ends with the Locust worker's own status."])


class VoiceLLMError(Exception):
    """Base of every error the CLI reports as a plain message (no traceback)."""


class ProvisionError(VoiceLLMError):
    """Building llama-server or fetching the model failed."""


class ServerError(VoiceLLMError):
    """Starting, finding or stopping the managed llama-server failed."""


class PortInUseError(ServerError):
    """Something other than our server listens on the requested port."""


class ConfigError(VoiceLLMError):
    """A flag or setting is not acceptable (for example a non-loopback host without an API key)."""


class KnowledgeBaseError(VoiceLLMError):
    """The KB folder is missing, empty, or holds a document that cannot be read."""


class OutputDirError(VoiceLLMError):
    """The output folder cannot be created or written."""


class OutputBusyError(OutputDirError):
    """Another voice-llm run is writing to the same output folder."""


class ArtifactError(VoiceLLMError):
    """An artifact needed by a later step or by ``check`` is missing or malformed."""


class NoDataError(ArtifactError):
    """The step ran but saved no measurement where a number goes (a null, NaN, an empty list: what a step whose
    every attempt failed leaves). ``check`` fails on it like any ArtifactError; a report section says "no data"
    with this reason."""


class MeasurementError(VoiceLLMError):
    """A measurement could not be made honestly (for example generation ended before the cancel cut)."""


class ContextLimitError(VoiceLLMError):
    """The lab's longest prompt does not fit the server's context; found before the first request of the run."""


class TTSError(VoiceLLMError):
    """Text-to-speech failed: the engine or voice cannot be used, or synthesis broke."""


class TTSUnavailableError(TTSError):
    """The engine itself is not installed (the piper-tts package, the espeak-ng program)."""


class VoiceFileError(TTSError):
    """The voice file (or its config) is missing, unreadable or not a voice model."""


class SynthesisError(TTSError):
    """The engine failed while synthesizing a segment of an answer."""


class SynthesisTimeoutError(SynthesisError):
    """The engine's program did not finish a segment within the deadline; it was stopped."""


class NothingToSpeakError(TTSError):
    """The answer held no text the engine could turn into sound."""


class ReportIncompleteError(ArtifactError):
    """report.html (or compare.html) was written, but drawing some of its sections raised. ``path`` is the page,
    ``failures`` the (section, error) pairs. The measurements are untouched: a page is drawn after they are saved,
    so the CLI says so in one line and exits with its own status (EXIT_REPORT_INCOMPLETE above)."""

    def __init__(self, path: object, failures: tuple[tuple[str, str], ...]) -> None:
        self.path = path
        self.failures = tuple(failures)
        named = "; ".join(f"{name}: {error}" for name, error in self.failures)
        super().__init__(f"{path} was written, but {len(self.failures)} section(s) could not be drawn ({named}); "
                         "every measurement is saved and `voice-llm check` reads them")
