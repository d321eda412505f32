"""Layer 3: rendering: report.html, compare.html, the capability table."""
