"""The model families skipv1 converts, in one table: for each, the source architectures that map
to it, its SkipV1 classes and modeling files, and what sets it apart. Every other module (the
checkpoint checks, the plan, the converted config, the companions, the parameter count) reads
this table instead of testing names."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str  # "llama": model_type skipv1_llama, files *_skipv1_llama.py
    class_prefix: str  # "Llama": SkipV1LlamaConfig, SkipV1LlamaForCausalLM
    sources: dict[str, str]  # source architecture -> source kind
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (q_norm, k_norm)
    # A source with an active sliding window: True refuses it, False converts it with the
    # context clamped to the window (exact within it).
    refuse_sliding_window: bool = False
    # Sliding-window layers kept as the source has them (layer_types): the SkipV1 cache holds
    # layer 0's borrowed value heads for the full context (modeling_skipv1_core).
    keeps_sliding_window: bool = False
    # Gemma's RMSNorms around attention and MLP outputs (pre/post_feedforward_layernorm), scaled
    # embeddings, zero-centred norm weights (x * (1 + w)).
    gemma_layout: bool = False
    # The calibrated inits (calibrated, reconstruct) run the family's layers through a forward
    # written out by hand (calibrate.py, reconstruct.py); False refuses them for the family.
    calibrated_inits: bool = True

    @property
    def model_type(self) -> str:
        return f"skipv1_{self.name}"

    @property
    def architecture(self) -> str:
        return f"SkipV1{self.class_prefix}ForCausalLM"

    @property
    def auto_map(self) -> dict[str, str]:
        return {
            "AutoConfig": f"configuration_skipv1_{self.name}.SkipV1{self.class_prefix}Config",
            "AutoModelForCausalLM": f"modeling_skipv1_{self.name}.{self.architecture}",
        }

    @property
    def modeling_files(self) -> tuple[str, ...]:
        """The files `auto_map` loads, with the siblings they import."""
        return (
            f"configuration_skipv1_{self.name}.py",
            f"modeling_skipv1_{self.name}.py",
            "modeling_skipv1_core.py",
            "paged_cache_skipv1.py",
        )


LLAMA = Family(
    "llama",
    "Llama",
    {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"},
)
QWEN3 = Family(
    "qwen3",
    "Qwen3",
    {"Qwen3ForCausalLM": "qwen3"},
    qk_norm=True,
    refuse_sliding_window=True,
)
GEMMA2 = Family(
    "gemma2",
    "Gemma2",
    {"Gemma2ForCausalLM": "gemma2"},
    keeps_sliding_window=True,
    gemma_layout=True,
)
GEMMA3_TEXT = Family(
    "gemma3_text",
    "Gemma3Text",
    {"Gemma3ForCausalLM": "gemma3_text"},
    qk_norm=True,
    keeps_sliding_window=True,
    gemma_layout=True,
)
FAMILIES = (LLAMA, QWEN3, GEMMA2, GEMMA3_TEXT)

SOURCE_ARCHITECTURES = {arch: kind for f in FAMILIES for arch, kind in f.sources.items()}
# A config without `architectures` (older or hand-written ones) is recognised by its model_type,
# which for every source kind above is transformers' model_type of that class.
ARCHITECTURE_OF_MODEL_TYPE = {
    **{kind: arch for arch, kind in SOURCE_ARCHITECTURES.items()},
    **{f.model_type: f.architecture for f in FAMILIES},
}
SKIPV1_ARCHITECTURES = {f.architecture: f for f in FAMILIES}
SKIPV1_MODEL_TYPES = {f.model_type: f for f in FAMILIES}


def family_of(config: dict) -> Family | None:
    """The family of a source or converted config.json (None: not one we know)."""
    if config.get("model_type") in SKIPV1_MODEL_TYPES:
        return SKIPV1_MODEL_TYPES[config["model_type"]]
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    arch = arch or ARCHITECTURE_OF_MODEL_TYPE.get(config.get("model_type"))
    for family in FAMILIES:
        if arch in family.sources or arch == family.architecture:
            return family
    return None
