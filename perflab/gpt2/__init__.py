"""perflab.gpt2.model: Chapter 10: a readable GPT-2 and its speed and memory ladders."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
