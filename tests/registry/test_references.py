"""Every name the registry resolves at run time resolves now (issue 26.2): each "module:function" of every
registered capability (checks, sections, step modules, metrics, key numbers, cli, commands, options, install, compare
and its compare sections) and
the core's step modules. A typo is found here, naming the capability, the thing and the reference, instead of at
a run as a FAIL row or a section that "could not be drawn". Imports the capabilities' modules; starts nothing."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from voice_llm.core import registry
from voice_llm.core.checks.core import CHECKS
from voice_llm.core.lab.steps import CORE_STEPS
from voice_llm.core.registry import CheckEntry, SectionEntry, StepEntry
from voice_llm.core.report.page import CORE_SECTIONS


def _every_capability() -> list[registry.Capability]:
    """Every registered capability, also one VOICE_LLM_WITHOUT would leave out of this process."""
    return [importlib.import_module(package).CAPABILITY for package in registry.CAPABILITIES]


@pytest.mark.parametrize("package", registry.CAPABILITIES)
def test_every_reference_of_a_registered_capability_resolves(package: str) -> None:
    capability = importlib.import_module(package).CAPABILITY
    assert registry.unresolved(capability) == []


def test_the_references_cover_every_kind_a_capability_can_make() -> None:
    """What is checked above is everything there is: every kind of reference some capability makes is listed."""
    kinds = {what.split(" ")[0] for c in _every_capability() for what, _ in registry.references(c)}
    assert kinds == {"check", "section", "step", "metrics", "key_numbers", "cli", "commands", "options", "install",
                     "compare", "headline"}  # "compare": the compare hook and each compare section


def test_the_cores_entries_are_the_same_types_holding_their_functions() -> None:
    assert all(type(entry) is CheckEntry and callable(entry.function) for entry in CHECKS)
    assert all(type(entry) is SectionEntry and callable(entry.builder) for entry in CORE_SECTIONS)
    assert all(type(entry) is StepEntry for entry in CORE_STEPS)
    for step in CORE_STEPS:  # the core's steps are named by module too
        assert callable(registry.resolve(f"{step.module}:run")), step


def test_a_capability_lists_each_thing_once() -> None:
    for capability in _every_capability():
        for kind in ("sections", "steps"):
            names = [entry.name for entry in getattr(capability, kind)]
            assert len(names) == len(set(names)), (capability.name, kind, names)
        # A check once per step. Two steps writing the same artifact may share a check (dial's `dial` and the lab's
        # `converse` both write dial.json): then the name is the same check of the same artifact in both, which
        # the core runs once in a folder where both apply (voice_llm.core.checks.core.capability_checks).
        names = [(entry.step, entry.name) for entry in capability.checks]
        assert len(names) == len(set(names)), (capability.name, names)
        functions = [(entry.step, entry.function) for entry in capability.checks]
        assert len(functions) == len(set(functions)), (capability.name, functions)
        by_name: dict[str, set[tuple[object, object]]] = {}
        for entry in capability.checks:
            by_name.setdefault(entry.name, set()).add((entry.function, entry.artifact))
        assert all(len(found) == 1 for found in by_name.values()), (capability.name, by_name)


# --- a planted typo is named --------------------------------------------------------------------------------


def _planted(capability: registry.Capability, kind: str) -> tuple[registry.Capability, str]:
    """A copy of ``capability`` with one reference of ``kind`` misspelt, and the misspelt reference."""
    if kind == "check":
        entry = capability.checks[-1]
        typo = f"{entry.function}x"
        return dataclasses.replace(capability, checks=(*capability.checks[:-1], dataclasses.replace(entry, function=typo))), typo
    if kind == "section":
        entry = capability.sections[0]
        typo = str(entry.builder).replace(".report:", ".reprot:")
        return dataclasses.replace(capability, sections=(dataclasses.replace(entry, builder=typo), *capability.sections[1:])), typo
    if kind == "step":
        entry = capability.steps[0]
        typo = f"{entry.module}s"
        return dataclasses.replace(capability, steps=(dataclasses.replace(entry, module=typo),)), f"{typo}:run"
    if kind == "compare section":
        entry = capability.compare_sections[0]
        typo = str(entry.builder).replace(".report:", ".reprot:")
        return dataclasses.replace(capability, compare_sections=(dataclasses.replace(entry, builder=typo),)), typo
    typo = f"{getattr(capability, kind)}_"
    return dataclasses.replace(capability, **{kind: typo}), typo


@pytest.mark.parametrize("package, kind", [
    ("voice_llm.capabilities.speak", "check"), ("voice_llm.capabilities.dial", "check"), ("voice_llm.capabilities.load", "check"), ("voice_llm.capabilities.conversation", "check"),
    ("voice_llm.capabilities.speak", "section"), ("voice_llm.capabilities.repeats", "section"), ("voice_llm.capabilities.conversation", "section"),
    ("voice_llm.capabilities.speak", "step"), ("voice_llm.capabilities.conversation", "step"),
    ("voice_llm.capabilities.speak", "metrics"), ("voice_llm.capabilities.dial", "key_numbers"), ("voice_llm.capabilities.speak", "cli"),
    ("voice_llm.capabilities.load", "commands"), ("voice_llm.capabilities.dial", "options"), ("voice_llm.capabilities.speak", "install"),
    ("voice_llm.capabilities.load", "compare"), ("voice_llm.capabilities.load", "compare section"),
])
def test_a_planted_typo_is_named(package: str, kind: str) -> None:
    capability = importlib.import_module(package).CAPABILITY
    copy, typo = _planted(capability, kind)
    (line,) = registry.unresolved(copy)
    assert line.startswith(f"{capability.name}: {kind}") and typo in line, line
    assert registry.unresolved(capability) == []  # the registered value itself is untouched


def test_a_typo_is_a_clear_error_when_the_core_calls_it() -> None:
    with pytest.raises(registry.UnresolvedReference, match="voice_llm.capabilities.speak.checks has no function check_wavz"):
        registry.resolve("voice_llm.capabilities.speak.checks:check_wavz")
    with pytest.raises(registry.UnresolvedReference, match="there is no module voice_llm.capabilities.speak.chekcs"):
        registry.resolve("voice_llm.capabilities.speak.chekcs:check_wavs")
    with pytest.raises(registry.UnresolvedReference, match="not a 'module:function'"):
        registry.resolve("voice_llm.capabilities.speak.checks")
