"""The exceptions of voice-llm. The CLI turns each into one line on stderr and a non-zero exit.

Stream errors live in :mod:`voice_llm.sse` (which must stand alone, standard library only); everything else is
a :class:`VoiceLLMError`.
"""

from __future__ import annotations


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
    so the CLI says so in one line and exits with its own status (cli.EXIT_REPORT_INCOMPLETE)."""

    def __init__(self, path: object, failures: tuple[tuple[str, str], ...]) -> None:
        self.path = path
        self.failures = tuple(failures)
        named = "; ".join(f"{name}: {error}" for name, error in self.failures)
        super().__init__(f"{path} was written, but {len(self.failures)} section(s) could not be drawn ({named}); "
                         "every measurement is saved and `voice-llm check` reads them")
