# The two set-up commands of the README:
#   make lab   - the whole lab on the default model: artifacts + report in $(OUT)
#   make test  - everything the tests need (llama-server build, model, TTS voice, chromium, espeak-ng), then the whole suite
#   make test-fast - the tests not marked slow (no real server, lab, Locust, browser or speech engine): while coding
#   make screenshots - docs/*.png and docs/screenshots.json from a real lab (the README's screenshots)
#   make docs - docs/cli.md from the parser, then the site in site/ (MkDocs, strict, offline)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
OUT    ?= $(HOME)/voice/llm
PORT   ?= 8080
# Repeats of prefill, cache, sentence, cancel and speak (ttft keeps 5 runs). make lab uses 2 to stay near 3 minutes
# on 2 idle cores (the CLI default is 3); 1 is the brief's single measurement.
REPEAT ?= 2
PYTEST_ARGS ?=
# Four workers on 2 cores: the fast tier mostly waits (measured on this machine, 1936 tests: 228 s with 2 workers,
# 157 s with 4, 176 s with 6).
FAST_JOBS ?= 4

.PHONY: lab test test-fast install venv clean screenshots docs

# pip byte-compiles what it installs. --no-compile was tried (2026-12-02, fresh clone): the install went 89 -> 65 s,
# but the fast tier 117 -> 161 s, its 4 workers compiling the same imports on first use; so pip compiles.
$(BIN)/voice-llm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

venv: $(BIN)/voice-llm

# Builds llama-server once (6.5-8 min on a 2-core AMD EPYC VM: README) and fetches the model; both cached in ~/.cache/voice-llm.
install: venv
	command -v cmake >/dev/null || $(BIN)/python -m pip install --quiet --disable-pip-version-check cmake
	$(BIN)/voice-llm install

lab: install
	$(BIN)/voice-llm lab --port $(PORT) --out $(OUT) --repeat $(REPEAT)

# llama-cpp-python (the second backend the tests run the lab against) is sdist-only: its wheel is built once
# (~3 min on 2 cores) into ~/.cache/voice-llm and installed from there.
# The tests also run the pipecat agent for real (the optional extra `pipecat`; `make lab` does not need it), and
# calls over WebRTC (the extra `webrtc`: aiortc, pinned; neither `make lab` nor `make install` installs it).
# Two runs, every test once: the fast tier on FAST_JOBS workers (its tests share nothing, and most of its time is
# waiting: subprocesses, fake servers trickling, deadlines), then the slow tier in one process (its session lab and
# server are started once, and its llama-servers get the cores to themselves: two of them on 2 cores, each spinning
# its threads, took minutes for what one does in seconds; measured 2026-12-02, two slow workers were slower than
# one; the fast tier run beside the slow tier: 1185 s against 1175 s for the whole .ci/run, the slow tier
# 885 -> 1058 s). Both run even if the first fails; either failing fails `make test` (pytest's exit 5, no test collected,
# included).
# Two pip runs (.[test] with the venv, then .[test,pipecat,webrtc]): one run with both extras was measured slower on a
# fresh venv (81-86 s against 78 s, 2026-12-02; pip resolves the larger set at once).
test: install
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,pipecat,webrtc]'
	sh scripts/ensure-apt.sh chromium:chromium espeak-ng:espeak-ng
	$(BIN)/python -m voice_llm.core.server.backends.llama_cpp_python
	fast=0; $(BIN)/python -m pytest -m "not slow" -n $(FAST_JOBS) $(PYTEST_ARGS) || fast=$$?; \
	slow=0; $(BIN)/python -m pytest -m slow $(PYTEST_ARGS) || slow=$$?; \
	echo "make test: fast tier exit $$fast, slow tier exit $$slow"; test $$fast -eq 0 && test $$slow -eq 0

# The fast tier (pyproject's `slow` marker, tests/conftest.py): no llama-server build, model, llama-cpp-python or
# browser is needed, so none is fetched; a test that asks for one is slow by its fixture and left out. Its tests
# share nothing across modules, so they run on FAST_JOBS workers (pytest-xdist; FAST_JOBS=0 runs them in one process).
test-fast: venv
	$(BIN)/python -m pytest -m "not slow" -n $(FAST_JOBS) $(PYTEST_ARGS)

# The README's screenshots (docs/*.png) and their stamp (docs/screenshots.json) from a real lab on SHOTS_PORT (not
# PORT: a `make lab` server may be up there), its server stopped after; about 5-7 min on 2 cores with the build
# cached. tests/layout/test_screenshots.py fails when the code that draws them or the lab's steps changed since.
SHOTS_PORT ?= 8093
SHOTS_OUT  ?= /tmp/shots-lab
screenshots: install
	sh scripts/ensure-apt.sh chromium:chromium tmux:tmux espeak-ng:espeak-ng
	$(BIN)/python scripts/screenshots.py make --port $(SHOTS_PORT) --out $(SHOTS_OUT) --repeat 1

# The docs site (docs/contributing.md "The docs"): the CLI reference is regenerated first, so a new flag is in it;
# --strict turns a broken link into a failed build, as tests/docs/test_docs_build.py does.
docs: venv
	$(BIN)/python scripts/cli_reference.py
	$(BIN)/python -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache site
