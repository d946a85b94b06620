"""The model families skipv1 converts, in one table: for each, the source architectures that map
to it, its SkipV1 classes and modeling files, and what sets it apart. Every other module (the
checkpoint checks, the plan, the converted config, the companions, the parameter count) reads
this table instead of testing names."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerNorms:
    """A decoder layer's norms by where they sit (their checkpoint names; None: no norm there)."""

    attention_input: str | None
    attention_output: str | None  # on the attention's output, before the residual add
    mlp_input: str | None
    mlp_output: str | None

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in vars(self).values() if n is not None)


# Before attention and MLP (Llama, Qwen3, the MoEs: post_attention_layernorm is the MLP's input
# norm there)
PRE_NORMS = LayerNorms("input_layernorm", None, "post_attention_layernorm", None)
# After them, on their outputs (OLMo-2)
POST_NORMS = LayerNorms(None, "post_attention_layernorm", None, "post_feedforward_layernorm")
# Both (Gemma)
PRE_AND_POST_NORMS = LayerNorms(
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


@dataclass(frozen=True)
class ExpertLayout:
    """How a mixture-of-experts MLP names its tensors in a checkpoint (the hub's layout, which
    transformers' save_pretrained writes too): model.layers.{i}.{block}.gate.weight (the router)
    and model.layers.{i}.{block}.experts.{e}.{gate,up,down}.weight."""

    block: str  # "block_sparse_moe" (Mixtral), "mlp" (Qwen3-MoE)
    gate: str
    up: str
    down: str
    intermediate_field: str  # config field: each expert's intermediate size

    @staticmethod
    def count(config: dict) -> int:
        """Experts per layer: transformers writes num_local_experts, Qwen3-MoE's Hub configs
        num_experts."""
        return config.get("num_local_experts", config.get("num_experts")) or 0

    def is_sparse(self, config: dict, layer: int) -> bool:
        """Whether layer `layer` has the MoE MLP (Qwen3-MoE may keep dense MLPs in some)."""
        step = config.get("decoder_sparse_step") or 1
        dense = config.get("mlp_only_layers") or []
        return layer not in dense and self.count(config) > 0 and (layer + 1) % step == 0


@dataclass(frozen=True)
class Family:
    name: str  # "llama": model_type skipv1_llama, files *_skipv1_llama.py
    class_prefix: str  # "Llama": SkipV1LlamaConfig, SkipV1LlamaForCausalLM
    sources: dict[str, str]  # source architecture -> source kind
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (q_norm, k_norm)
    # Sliding-window layers kept as the source has them (layer_types): the SkipV1 cache holds
    # layer 0's borrowed value heads for the full context (modeling_skipv1_core). A family that
    # does not keep them is converted with the context clamped to the window (exact within it).
    keeps_sliding_window: bool = False
    # input embeddings times sqrt(hidden_size) (Gemma)
    scaled_embeddings: bool = False
    # lm_head is the embedding matrix when config.json does not say (transformers' default for
    # the family: GPT-2, Gemma)
    tied_by_default: bool = False
    # q/k/v in one tensor per layer: where the value rows sit is convert/fused.py's layout
    fused_qkv: bool = False
    # (standard name, the family's name) of config.json fields (GPT-2's n_embd is hidden_size)
    config_aliases: tuple[tuple[str, str], ...] = ()
    # "head": q_norm / k_norm weights (head_dim,) shared by every head (Qwen3); "projection":
    # over the whole q / k projection (OLMo-2), weights (heads * head_dim,), which move with a
    # head permutation
    qk_norm_scope: str = "head"
    # where the layer's norms sit (PRE_NORMS, POST_NORMS, PRE_AND_POST_NORMS): the plan's tensors,
    # the parameter count and the calibrated inits' hand-written forwards read it
    norms: LayerNorms = PRE_NORMS
    experts: ExpertLayout | None = None  # the MLP is a mixture of experts

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
            "static_cache_skipv1.py",
            "split_attention_skipv1.py",
        )


LLAMA = Family(
    "llama",
    "Llama",
    {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"},
    keeps_sliding_window=True,  # Mistral's and Qwen2's windows, as explicit layer_types
)
QWEN3 = Family(
    "qwen3",
    "Qwen3",
    {"Qwen3ForCausalLM": "qwen3"},
    qk_norm=True,
    keeps_sliding_window=True,  # layer_types from use_sliding_window / max_window_layers
)
GEMMA2 = Family(
    "gemma2",
    "Gemma2",
    {"Gemma2ForCausalLM": "gemma2"},
    keeps_sliding_window=True,
    scaled_embeddings=True,
    tied_by_default=True,
    norms=PRE_AND_POST_NORMS,
)
GEMMA3_TEXT = Family(
    "gemma3_text",
    "Gemma3Text",
    {"Gemma3ForCausalLM": "gemma3_text"},
    qk_norm=True,
    keeps_sliding_window=True,
    scaled_embeddings=True,
    tied_by_default=True,
    norms=PRE_AND_POST_NORMS,
)
PHI3 = Family(
    "phi3",
    "Phi3",
    {"Phi3ForCausalLM": "phi3"},
    keeps_sliding_window=True,  # every layer slides, as in the source (no layer_types)
    fused_qkv=True,
)
# LayerNorms, parallel residual, partial rotary: the calibrated inits read its layers through
# Llama-named faces (convert/faces.py), as GPT-2's
GPT_NEOX = Family("gpt_neox", "GPTNeoX", {"GPTNeoXForCausalLM": "gpt_neox"}, fused_qkv=True)
GPT2 = Family(
    "gpt2",
    "GPT2",
    {"GPT2LMHeadModel": "gpt2"},
    fused_qkv=True,
    tied_by_default=True,
    config_aliases=(
        ("hidden_size", "n_embd"),
        ("num_attention_heads", "n_head"),
        ("num_hidden_layers", "n_layer"),
        ("max_position_embeddings", "n_positions"),
        ("intermediate_size", "n_inner"),
    ),
)
OLMO2 = Family(
    "olmo2",
    "Olmo2",
    {"Olmo2ForCausalLM": "olmo2"},
    qk_norm=True,
    qk_norm_scope="projection",
    norms=POST_NORMS,
)
MIXTRAL = Family(
    "mixtral",
    "Mixtral",
    {"MixtralForCausalLM": "mixtral"},
    keeps_sliding_window=True,  # every layer slides, as in the source (no layer_types)
    experts=ExpertLayout("block_sparse_moe", "w1", "w3", "w2", "intermediate_size"),
)
QWEN3_MOE = Family(
    "qwen3_moe",
    "Qwen3Moe",
    {"Qwen3MoeForCausalLM": "qwen3_moe"},
    qk_norm=True,
    keeps_sliding_window=True,  # with use_sliding_window every layer slides (no layer_types)
    experts=ExpertLayout("mlp", "gate_proj", "up_proj", "down_proj", "moe_intermediate_size"),
)
FAMILIES = (LLAMA, QWEN3, PHI3, GPT_NEOX, GPT2, OLMO2, MIXTRAL, QWEN3_MOE, GEMMA2, GEMMA3_TEXT)

SOURCE_ARCHITECTURES = {arch: kind for f in FAMILIES for arch, kind in f.sources.items()}
# For help texts: "Llama, Mistral, Qwen2, ..." (the source classes without their head's suffix)
SOURCE_NAMES = ", ".join(
    a.removesuffix("ForCausalLM").removesuffix("LMHeadModel") for a in SOURCE_ARCHITECTURES
)
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
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    arch = arch or ARCHITECTURE_OF_MODEL_TYPE.get(config.get("model_type"))
    for family in FAMILIES:
        if arch in family.sources or arch == family.architecture:
            return family
    return None


def standard_fields(config: dict) -> dict:
    """config.json with the standard field names (hidden_size, ...) that every module reads,
    filled in from the family's own names (GPT-2's n_embd, ...) where it has others."""
    family = family_of(config)
    if family is None or not family.config_aliases:
        return config
    out = dict(config)
    for standard, own in family.config_aliases:
        if out.get(standard) is None and own in out:
            out[standard] = out[own]
    if family.name == "gpt2" and out.get("intermediate_size") is None and "hidden_size" in out:
        out["intermediate_size"] = 4 * out["hidden_size"]  # GPT-2's n_inner=None
    return out
