"""The numbers the brief fixes, in one place: the lab steps that measure and `check` that verifies both read them.

Changing one of these changes the experiment, so each says where in the brief it comes from.
"""

from __future__ import annotations

# Step 3: "Send the question from 02 five times with cache_prompt=False"; the median is the third of five.
TTFT_RUNS = 5
# Step 4: "attach the first 0 · 4 · 12 of them to the system prompt", max_tokens=32.
PREFILL_DOC_COUNTS = (0, 4, 12)
PREFILL_MAX_TOKENS = 32
# Step 5 uses the same long prompt as the largest prefill point (all twelve documents).
CACHE_DOCS = PREFILL_DOC_COUNTS[-1]
# The brief's request body: max_tokens 64 unless a step says otherwise.
DEFAULT_MAX_TOKENS = 64
# Step 6: "with max_tokens=120".
SENTENCE_MAX_TOKENS = 120
# Step 7: "with max_tokens=256, close the connection after 0.5 seconds".
CANCEL_MAX_TOKENS = 256
CANCEL_CLOSE_AFTER_MS = 500.0
