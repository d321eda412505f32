"""One rule for "this decode is as good as that one" on real speech, for tests that compare two ways of
transcribing the same lines with tiny.en (the speculative decode against the plain one, the 10 s window against
the 30 s one). Why not "the same words": CTranslate2's float kernels differ by CPU, and a word at a decision
boundary can tip (seen on an AMD EPYC: "comes out" at the last speech end, "comes up" 300 ms later; the same
words on Intel). Scored against the script with voice_llm.engines.speech_in.wer, the candidate may have at most one word
error more than the baseline on any line, and at most 5 % of the words more over all lines; a decode that drops
or repeats part of a line is several words off and fails."""

from __future__ import annotations

from collections.abc import Sequence

from voice_llm.engines.speech_in import wer

EXTRA_ERRORS_A_LINE = 1
EXTRA_SHARE_OVERALL = 0.05


def assert_as_good(scored: Sequence[tuple[str, str, str]]) -> None:
    """``scored``: (script, candidate transcript, baseline transcript) for each line."""
    assert scored, "no line was transcribed"
    candidate, baseline = [], []
    for script, ours, theirs in scored:
        candidate.append(wer.wer(script, ours))
        baseline.append(wer.wer(script, theirs))
        assert candidate[-1].errors <= baseline[-1].errors + EXTRA_ERRORS_A_LINE, (script, ours, theirs)
    total, base = wer.total(candidate), wer.total(baseline)
    assert total.errors <= base.errors + EXTRA_SHARE_OVERALL * base.words, (total, base)
