"""The lab: the brief's steps, each a small unit that makes requests and writes its own artifact, and the
pipeline that runs them (``run_lab``) as a library call."""

from voice_llm.core.lab.pipeline import LabResult, LabSettings, run_lab, run_steps

__all__ = ["LabResult", "LabSettings", "run_lab", "run_steps"]
