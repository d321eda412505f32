"""Layer 6: the command line: parse, call a library function, print. Nothing below imports it."""
