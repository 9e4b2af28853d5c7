"""ReplaySSM for vLLM 0.24: cache SSM inputs, not state. See replayssm_patch/README.md."""


def register() -> None:
    """vLLM general-plugin entry point (filled in by the plugin issue)."""
