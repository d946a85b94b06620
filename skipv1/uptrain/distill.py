"""Distillation from a frozen teacher (the source model) during uptraining.

loss = (1 - alpha) * CE(student, next token)
       + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
       [+ beta * hidden-state term, `hidden_state_loss`],

both terms averaged over the same predicted tokens (positions 0..n-2 of each block predict
tokens 1..n-1, as in the model's own loss). The T^2 factor keeps the KL gradient on the scale of
the CE gradient when T changes (Hinton et al., 2015).

Memory: besides the student's and the teacher's logits (which the forwards produce anyway) this
holds the student's log-probabilities (saved by autograd) and one fp32 buffer for the teacher's,
computed in place; at T = 1 the CE reuses the student's log-probabilities instead of a second
softmax. The KL itself still makes elementwise temporaries of the same size while it runs.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def alpha_at(alpha: float, alpha_end: float | None, step: int, total_steps: int) -> float:
    """The KL weight of optimizer step `step` (0-based): `alpha` on the first step, linearly to
    `alpha_end` on the last (a strong pull to the teacher while the converted model is far from
    it, the plain loss's freedom to pass it later). A function of the step alone, so a resumed
    run continues the same schedule."""
    if alpha_end is None or total_steps <= 1:
        return alpha
    return alpha + (alpha_end - alpha) * min(step, total_steps - 1) / (total_steps - 1)


@dataclass(frozen=True)
class DistillLoss:
    loss: torch.Tensor  # what backward() is called on
    ce: torch.Tensor  # token-mean cross-entropy against the next token
    kl: torch.Tensor  # token-mean KL(teacher || student) at temperature T (without T^2)


def teacher_log_probs(teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(teacher / T) over next-token positions, computed in place (no grad)."""
    with torch.no_grad():
        logits = teacher_logits[:, :-1].float()
        if logits.data_ptr() == teacher_logits.data_ptr():  # .float() did not copy: do not
            logits = logits.clone()  # overwrite the caller's tensor
        logits.div_(temperature)
        return logits.sub_(logits.logsumexp(dim=-1, keepdim=True))


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    input_ids: torch.Tensor,
    alpha: float,
    temperature: float,
) -> DistillLoss:
    """The combined loss for a micro-batch; logits are [batch, seq, vocab], ids [batch, seq]."""
    targets = input_ids[:, 1:].reshape(-1)
    student = student_logits[:, :-1].float()
    vocab = student.shape[-1]
    scaled = student if temperature == 1.0 else student / temperature
    student_lp = F.log_softmax(scaled, dim=-1).reshape(-1, vocab)
    if temperature == 1.0:
        ce = F.nll_loss(student_lp, targets)
    else:
        ce = F.cross_entropy(student.reshape(-1, vocab), targets)
    teacher_lp = teacher_log_probs(teacher_logits, temperature).reshape(-1, vocab)
    # sum over the vocabulary, mean over tokens
    kl = F.kl_div(student_lp, teacher_lp, reduction="batchmean", log_target=True)
    loss = (1 - alpha) * ce + alpha * temperature**2 * kl
    return DistillLoss(loss, ce.detach(), kl.detach())


def hidden_state_loss(student: tuple, teacher: tuple) -> torch.Tensor:
    """Mean over decoder layers of ||h_s - h_t||^2 / ||h_t||^2 (sums over the hidden size, mean
    over tokens): each layer's residual stream pulled to the teacher's, scale-free across layers
    whose norms differ by orders of magnitude. `student` and `teacher` are the models'
    `hidden_states` (the embeddings first, which SkipV1 does not change: skipped). Zero when the
    student computes the teacher's function."""
    terms = [
        (s.float() - t.float()).pow(2).sum(-1) / t.float().pow(2).sum(-1).clamp_min(1e-12)
        for s, t in zip(student[1:], teacher[1:], strict=True)
    ]
    return torch.stack([term.mean() for term in terms]).mean()
