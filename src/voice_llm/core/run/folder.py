"""A run folder read once: every artifact ``check`` and the report look at, parsed at most once per command.

``check`` ran some twenty relations, each re-reading and re-parsing its files (run.json five times, the manifest
hashed by ``check`` and again by the report); pyperf loads a benchmark file into one object and works on that.
:class:`RunFolder` is that object for a run folder: each file is read once through the jail
(:func:`voice_llm.core.util.artifacts.inside` and :func:`~voice_llm.core.util.artifacts.read_artifact_bytes`: no link, no
FIFO, no file outside OUT, bounded), parsed once through the one guarded JSON parser
(:func:`~voice_llm.core.util.artifacts.loads_json`), and hashed once. A failure to read is remembered too, so every
reader of a broken file gets the same one-line error. Nothing is written: it is a view of the saved files alone.

Schema version, read back as pyperf does: every JSON artifact carries ``schema_version``
(:data:`voice_llm.core.run.meta.SCHEMA_VERSION`). A file of a newer, unknown version is refused with one line that
says to upgrade (its fields may mean something this voice-llm does not know); :meth:`RunFolder.require_known_schema`
refuses a whole folder whose run.json (or any top-level JSON artifact) is newer. An older known version (1, 2, and
a file from before schema versions) is read as before: version 3 added fields and changed only how medians of an
even number of samples are chosen, and the checks re-derive each file's numbers by the rule it states.

The folder's contents are taken as they are when first read: a command that writes a file and then wants it read
again makes a new RunFolder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from voice_llm.core.errors import ArtifactError
from voice_llm.core.run import meta as runmeta
from voice_llm.core.util.artifacts import RUN, inside, loads_json, read_artifact_bytes

# A typed artifact's class (voice_llm.core.run.artifacts.Artifact): not imported here, since that module reads the
# schema rule below (no import cycle); anything with ``NAME`` and ``parse(doc, what)`` will do.
A = TypeVar("A")

__all__ = ["RunFolder", "UnknownSchemaError", "refuse_unknown", "schema_of", "states_schema"]


class UnknownSchemaError(ArtifactError):
    """An artifact of a schema version this voice-llm does not know (written by a newer one): refused."""


def schema_of(doc: Any) -> Any:
    """The ``schema_version`` an artifact states, or None (a file from before versions, or one stating null:
    :func:`states_schema` tells them apart). A list artifact (prefill.json) states it in each row: the first row
    whose version is not a known number, else the newest."""
    if isinstance(doc, Mapping):
        return doc.get(runmeta.SCHEMA)
    if not isinstance(doc, list):
        return None
    found = [row[runmeta.SCHEMA] for row in doc if isinstance(row, Mapping) and runmeta.SCHEMA in row]
    odd = [v for v in found if isinstance(v, bool) or not isinstance(v, int)]
    return odd[0] if odd else max(found, default=None)


def states_schema(doc: Any) -> bool:
    """Does the artifact (or any row of a list artifact) have a ``schema_version`` key at all, whatever its value?
    Only a missing key means a file from before versions; ``"schema_version": null`` is a file that states none."""
    rows = doc if isinstance(doc, list) else [doc]
    return any(isinstance(row, Mapping) and runmeta.SCHEMA in row for row in rows)


def refuse_unknown(name: str, doc: Any) -> None:
    """The schema-version rule (see the module's docstring): an UnknownSchemaError naming ``name`` when ``doc``
    states a version this voice-llm does not read; nothing for a known one or a file from before versions."""
    version = schema_of(doc)
    if version is None and not states_schema(doc):
        return  # no key: a file from before schema versions, read as before
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        stated = "null" if version is None else repr(version)  # null is no version: only a missing key is old
        raise UnknownSchemaError(f"{name} states schema_version {stated}, not a version voice-llm knows")
    if version > runmeta.SCHEMA_VERSION:
        raise UnknownSchemaError(
            f"{name} was written by a newer voice-llm (artifact schema {version}; this one reads up to "
            f"{runmeta.SCHEMA_VERSION}): upgrade voice-llm to check or draw it")


class RunFolder:
    """One run folder, each file read, parsed and hashed at most once. ``path`` is OUT."""

    def __init__(self, path: Path, record: runmeta.RunRecord | None = None) -> None:
        """``record``: the run's record as a command holds it before it saves run.json (the report step checks
        the folder against the run.json it is about to write, not against the one on disk)."""
        self.path = path
        self._bytes: dict[str, bytes | ArtifactError] = {}
        self._docs: dict[str, Any] = {}
        self._doc_errors: dict[str, ArtifactError] = {}
        self._sha: dict[str, str] = {}
        self._record: runmeta.RunRecord | None | bool = False if record is None else record  # False: not read yet
        self._membership: runmeta.Membership | None = None
        self._typed: dict[type, Any] = {}  # an artifact's typed value, or the ArtifactError its parse raised

    @classmethod
    def of(cls, source: RunFolder | Path) -> RunFolder:
        """``source`` itself when it is a RunFolder, else a new one of that path: every check and section
        builder takes either, so each still works on a folder alone (a test, a caller of one check)."""
        return source if isinstance(source, RunFolder) else cls(Path(source))

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # --- files ---------------------------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """Is there anything at ``name`` (a link too: reading it then says why it is refused)?"""
        return os.path.lexists(self.path / name)

    def is_file(self, name: str) -> bool:
        return (self.path / name).is_file()

    def file(self, name: str) -> Path:
        """The path of ``name`` inside OUT (the jail: no absolute path, no ``..``, no link on the way)."""
        return inside(self.path, name)

    def bytes(self, name: str) -> bytes:
        """The bytes of ``name``, read once; a refusal (missing, a link, a FIFO, too large) is an ArtifactError,
        the same one every time it is asked."""
        if name not in self._bytes:
            try:
                self._bytes[name] = read_artifact_bytes(self.file(name))
            except ArtifactError as exc:
                self._bytes[name] = exc
        found = self._bytes[name]
        if isinstance(found, ArtifactError):
            raise found
        return found

    def text(self, name: str) -> str:
        try:
            return self.bytes(name).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{name} is not UTF-8 text: {exc}") from exc

    def _parsed(self, name: str) -> Any:
        """``name`` parsed once by the guarded parser, whatever its schema version."""
        if name in self._doc_errors:
            raise self._doc_errors[name]
        if name not in self._docs:
            try:
                self._docs[name] = loads_json(self.text(name), name)
            except ArtifactError as exc:
                self._doc_errors[name] = exc
                raise
        return self._docs[name]

    def json(self, name: str) -> Any:
        """One JSON artifact, parsed once; refused (an ArtifactError naming it) when missing, malformed, nested
        too deeply, or of a newer schema version than this voice-llm reads."""
        doc = self._parsed(name)
        refuse_unknown(name, doc)
        return doc

    def jsonl(self, name: str) -> list[Any]:
        """A JSON-lines artifact, each line through the guarded parser (parsed once, like :meth:`json`)."""
        key = f"{name}\0lines"
        if key in self._doc_errors:
            raise self._doc_errors[key]
        if key not in self._docs:
            try:
                rows = [loads_json(line, f"{name} line {number}")
                        for number, line in enumerate(self.text(name).splitlines(), start=1) if line.strip()]
            except ArtifactError as exc:
                self._doc_errors[key] = exc
                raise
            self._docs[key] = rows
        return self._docs[key]

    def artifact(self, kind: type[A]) -> A:
        """The file of a core artifact (``kind.NAME``, e.g. :class:`voice_llm.core.run.artifacts.Ttft`) as its typed
        value, read by :meth:`json` and parsed once (:meth:`voice_llm.core.run.artifacts.Artifact.parse`); a refusal is
        the same ArtifactError, naming the file and the field, every time it is asked. The kind is passed rather
        than the file name so that a type checker knows what comes back."""
        if kind not in self._typed:
            try:
                name = kind.NAME  # type: ignore[attr-defined]
                self._typed[kind] = kind.parse(self.json(name), name)  # type: ignore[attr-defined]
            except ArtifactError as exc:
                self._typed[kind] = exc
        found = self._typed[kind]
        if isinstance(found, ArtifactError):
            raise found
        return found  # type: ignore[no-any-return]

    def sha256(self, name: str) -> str:
        if name not in self._sha:
            self._sha[name] = runmeta.sha256_bytes(self.bytes(name))
        return self._sha[name]

    # --- the run ---------------------------------------------------------------------------------------------

    @property
    def record(self) -> runmeta.RunRecord | None:
        """run.json as the run's record, or None when there is none with a run id (an older voice-llm, or a
        run.json that does not parse: :meth:`json` says why), as :meth:`voice_llm.core.run.meta.RunRecord.load`."""
        if self._record is False:
            try:
                doc = self._parsed(RUN) if self.is_file(RUN) else None
            except ArtifactError:
                doc = None
            ok = isinstance(doc, dict) and isinstance(doc.get(runmeta.RUN_ID), str)
            self._record = runmeta.RunRecord(self.path, doc) if ok else None
        return self._record  # type: ignore[return-value]

    def require_known_schema(self, names: Iterable[str] = ()) -> None:
        """Refuse the folder in one line (:class:`UnknownSchemaError`) when run.json, ``names``, or any other JSON
        file at the top of OUT states a schema version newer than this voice-llm's. A file that does not parse is
        left to the check or section that reads it."""
        listed = [RUN, *names, *sorted(p.name for p in self.path.glob("*.json"))]
        for name in dict.fromkeys(listed):
            if not self.is_file(name) or (self.path / name).is_symlink():
                continue
            try:
                doc = self._parsed(name)
            except ArtifactError:
                continue
            refuse_unknown(name, doc)

    def membership(self) -> runmeta.Membership:
        """How the files relate to run.json (the one walk of the manifest), from the bytes read
        once: each file of the manifest hashed once, each JSON file's run id read by the guarded parser."""
        if self._membership is None:
            self._membership = self._compute_membership()
        return self._membership

    def _run_ids(self, name: str) -> set[str]:
        try:
            return runmeta.run_id_of(self._parsed(name))
        except ArtifactError:
            return set()

    def _compute_membership(self) -> runmeta.Membership:
        record = self.record
        if record is None:
            return runmeta.Membership(None, {}, [], [])
        manifest = record.doc.get("artifacts") or {}
        manifest = manifest if isinstance(manifest, Mapping) else {}
        expected = [name for name in record.doc.get("expected_artifacts") or [] if name not in manifest]
        other: dict[str, str] = {}
        changed: list[str] = []
        missing: list[str] = []
        for name in [*sorted(manifest), *expected]:
            try:  # a name in run.json is read only inside OUT, never through a link, bounded
                path = self.file(name)
            except ArtifactError as exc:
                raise ArtifactError(f"run.json names {name!r}, not a file of this folder: {exc}") from exc
            if not os.path.lexists(path):
                if name in manifest:
                    missing.append(name)
                continue
            self.bytes(name)  # a FIFO, device or huge file there: an ArtifactError naming it
            if name.endswith(".json"):
                foreign = sorted(self._run_ids(name) - {record.run_id})
                if foreign:
                    other[name] = foreign[0]
                    continue
            if name not in manifest or self.sha256(name) != manifest[name]:
                changed.append(name)
        # Any other JSON artifact at the top of OUT that names a run: one this run did not plan (a `load` or `call`
        # of an earlier run) is still in the folder, and a report would otherwise draw it as this run's.
        leftovers: set[str] = set()
        seen = set(manifest) | set(expected)
        for path in sorted(self.path.glob("*.json")):
            if path.name in seen or path.name in runmeta.UNMANIFESTED or path.is_symlink() or not path.is_file():
                continue
            foreign = sorted(self._run_ids(path.name) - {record.run_id})
            if foreign:
                other[path.name] = foreign[0]
                leftovers.add(path.name)
        return runmeta.Membership(record.run_id, other, changed, missing, frozenset(leftovers))

    def require_one_run(self, replacing: Iterable[str] = ()) -> runmeta.Membership:
        """Raise MixedRunsError naming the files of other runs among those this run wrote or expects (report and
        compare call this first); leftovers of another run this run never planned are skipped (Membership.belongs),
        and so are the files ``replacing`` names (the report step is about to write report.json anew)."""
        found = self.membership()
        skipped = {*found.leftovers, *replacing}
        within = {name: run for name, run in found.other_runs.items() if name not in skipped}
        if within:
            listed = ", ".join(f"{name} (run {run})" for name, run in within.items())
            raise runmeta.MixedRunsError(
                f"{self.path} mixes runs: run.json is run {found.run_id}, but {listed}; rerun those steps or the lab")
        return found
