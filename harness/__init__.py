"""replaybench: record real LLM traffic, replay it against paired servers, decide with statistics."""

__version__ = "0.1.0"
