"""The measuring core: the stand-alone SSE reader and sentence splitter, errors, the registry and util at its
bottom; the LLM client and scenario; the server lifecycle and the run folder; checks, analysis and report; the
lab pipeline on top. It imports no engine and no capability (tests/layout/test_layout_imports.py)."""
