"""The last stage of `--init reconstruct`: a short end-to-end distillation of the later layers'
attention parameters (q/k/v/o) from the source, on the calibration text.

The layer-by-layer refits match each layer's hidden states; this stage matches what counts, the
next-token distribution: KL(source || converted) on the even calibration sequences, AdamW with a
short warmup, and the held-out KL on the odd sequences measured every few steps; the parameters
with the lowest held-out KL are kept (so it never ends worse than it started). Everything but the
later layers' attention stays frozen: layer 0, norms, embeddings and MLPs keep the values the
earlier stages gave them. Unlike those stages it holds the whole model twice (source and
converted): run it on a GPU for large models, or pass `--calib-distill-steps 0`.
"""

from collections.abc import Callable

import torch

from ..modeling import FAMILY_CLASSES
from ..modeling.configuration_skipv1_llama import SkipV1LlamaConfig
from ..modeling.modeling_skipv1_llama import SkipV1LlamaForCausalLM
from ..uptrain.distill import distillation_loss
from .experts import module_state
from .faces import llama_names, model_state
from .names import later_attention_projection

LR = 1e-4
WARMUP_STEPS = 10
BATCH = 4  # sequences per step
HELD_OUT = 16  # odd sequences scored for the held-out KL
CHECKS = 4  # held-out evaluations over the run (besides the one before the first step)


def distill_attention(
    config: SkipV1LlamaConfig,
    state: dict[str, torch.Tensor],
    transform: Callable[[str, torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    skip_heads: int,
    steps: int,
    device: "str | torch.device" = "cpu",
    on_step: Callable[[int], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict]:
    """(trained tensors of the later layers' attention, record); `state` is the source's full
    state dict, `transform` the earlier stages' result, `config` the source (s = 0)."""
    teacher = _model(config, state, lambda name, t: t, 0, device)
    student = _model(config, state, transform, skip_heads, device)
    trained = {n: p for n, p in student.named_parameters() if _later_attention(config, n)}
    for name, p in student.named_parameters():
        p.requires_grad_(name in trained)
    optimizer = torch.optim.AdamW(trained.values(), lr=LR, weight_decay=0.0)
    ids = input_ids.to(device)
    train, held = ids[0::2], ids[1::2][:HELD_OUT]
    if not len(held):
        held = train
    generator = torch.Generator().manual_seed(0)
    best_kl = start_kl = _held_out_kl(student, teacher, held)
    best = {n: p.detach().clone() for n, p in trained.items()}
    every = max(1, steps // CHECKS)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / WARMUP_STEPS)
        rows = torch.randperm(len(train), generator=generator)[:BATCH].to(device)
        loss = _kl(student, teacher, train[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            kl = _held_out_kl(student, teacher, held)
            if kl < best_kl:
                best_kl, best = kl, {n: p.detach().clone() for n, p in trained.items()}
        if on_step:
            on_step(step)
    tensors = {name: t.float().cpu().contiguous() for name, t in best.items()}
    record = {"steps": steps, "lr": LR, "held_out_kl_before": start_kl, "held_out_kl": best_kl}
    return tensors, record


def _later_attention(config, name: str) -> bool:
    """q/k/v/o of layers >= 1: what the plan rewrites (a family's q/k norms stay the source's);
    GPT-NeoX's and GPT-2's fused q/k/v and output projections by their Llama names."""
    return any(later_attention_projection(n) is not None for n in llama_names(config, name))


def _model(config, state, transform, skip_heads, device) -> SkipV1LlamaForCausalLM:
    fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "auto_map")}
    fields.pop("architectures", None)
    config_class, causal_lm = FAMILY_CLASSES[config.model_type]
    with torch.device("meta"):
        model = causal_lm(config_class(**{**fields, "skip_v_heads": skip_heads}))
    # Trained tensors are copied so that training never writes into the caller's tensors.
    weights = {
        name: transform(name, t).float().clone()
        if _later_attention(config, name)
        else transform(name, t).float()
        for name, t in state.items()
    }
    weights = module_state(config, weights)  # a mixture of experts: stacked as the modules are
    weights = model_state(config, weights)  # GPT-NeoX's embed_out is lm_head
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise ValueError(f"state does not fit the model: {missing[:3]} {unexpected[:3]}")
    if "lm_head.weight" in missing:
        model.tie_weights()
    base = model.base_model
    if hasattr(base, "rotary_emb"):  # buffers off meta (GPT-2 has no RoPE)
        base.rotary_emb = type(base.rotary_emb)(model.config)
    embed = getattr(base, "embed_tokens", None)
    if hasattr(embed, "scalar_embed_scale"):  # Gemma's scaled embeddings: their buffer too
        embed.embed_scale = torch.tensor(embed.scalar_embed_scale)
    # eval: no dropout in teacher or student (GPT-2's configs default to 0.1); the gradients do
    # not depend on the mode
    return model.to(device).eval()


def _kl(student, teacher, ids) -> torch.Tensor:
    with torch.no_grad():
        teacher_logits = teacher(input_ids=ids).logits
    student_logits = student(input_ids=ids).logits
    return distillation_loss(student_logits, teacher_logits, ids, alpha=1.0, temperature=1.0).loss


@torch.no_grad()
def _held_out_kl(student, teacher, ids) -> float:
    total = 0.0
    for start in range(0, len(ids), BATCH):
        total += float(_kl(student, teacher, ids[start : start + BATCH])) * len(
            ids[start : start + BATCH]
        )
    return total / len(ids)
