"""The lab: the brief's steps, each a small unit that makes requests and writes its own artifact."""
