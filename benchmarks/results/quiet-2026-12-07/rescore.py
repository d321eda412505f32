"""Re-score pipecat's transcripts in saved dial folders with dial's current rule (otlp.match over the kept bodies)."""
import json, sys
from pathlib import Path
from voice_llm.capabilities.dial.otlp import JSON, PROTOBUF, decode_request, flatten, match, clock_for
from voice_llm.engines.speech_in.wer import wer
for path in sys.argv[1:]:
    p = Path(path); out = p.parent; doc = json.loads(p.read_text())
    spans = [s for i, n in enumerate(doc['files']['otlp'], 1)
             for s in flatten(decode_request((out / n).read_bytes(), JSON if n.endswith('.json') else PROTOBUF), i, 0.0)]
    ends = [t['caller']['speech_end_ms'] for t in doc['turns']]
    found = match(ends, spans, clock_for(spans, doc['t0_epoch_ns'], ends))
    errs = words = 0; old = 0
    for t, r in zip(doc['turns'], found):
        w = wer(t['script'], r.transcript or '') if r else None
        if w: errs += w.errors; words += w.words
        old += (t.get('wer') or {}).get('errors', 0)
    print(out.name, f"{errs}/{words} (recorded {old})")
