"""ReplaySSM for vLLM 0.24: cache SSM inputs, not state. See replayssm_patch/README.md."""

# vLLM architecture name -> our subclass in replayssm_patch.models (every vLLM model built on MambaMixer2).
MODEL_OVERRIDES = {
    "NemotronHForCausalLM": "ReplayNemotronHForCausalLM",
    "FalconH1ForCausalLM": "ReplayFalconH1ForCausalLM",
    "GraniteMoeHybridForCausalLM": "ReplayGraniteMoeHybridForCausalLM",
    "Zamba2ForCausalLM": "ReplayZamba2ForCausalLM",
    "Mamba2ForCausalLM": "ReplayMamba2ForCausalLM",
}
# The same for every vLLM model built on QwenGatedDeltaNetAttention (replayssm_patch.gdn_models).
GDN_MODEL_OVERRIDES = {
    "Qwen3NextForCausalLM": "ReplayQwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration": "ReplayQwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": "ReplayQwen3_5MoeForConditionalGeneration",
}

_registered = False


def register() -> None:
    """vLLM general-plugin entry point, run in every vLLM process before the server config is known.

    Cheap and idempotent: it only names our model subclasses to vLLM's registry (imported lazily by vLLM
    when the model is resolved). Whether ReplaySSM is on is decided later, from the config those classes
    receive; without ``--additional-config '{"replayssm": {"enable": true}}'`` they return vLLM's values.
    """
    global _registered
    if _registered:
        return
    from vllm.model_executor.models import ModelRegistry

    for arch, cls_name in MODEL_OVERRIDES.items():
        ModelRegistry.register_model(arch, f"replayssm_patch.models:{cls_name}")
    for arch, cls_name in GDN_MODEL_OVERRIDES.items():
        ModelRegistry.register_model(arch, f"replayssm_patch.gdn_models:{cls_name}")
    _registered = True
