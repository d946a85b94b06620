"""A later layer's attention over its own value heads and layer 0's borrowed ones, without
concatenating them: the concatenation would copy the layer's whole value cache at every decode
step (docs/results/attention_split.md measures both).

The query heads split where the value heads do: the first `own x groups` query heads read the
layer's own KV heads, the rest read the borrowed heads (with the layer's own keys). Two attention
calls over those head slices, merged by head, give exactly the one call over concatenated values.

Tried and dropped: for one query token with sdpa, calling torch's kernel directly instead of
transformers' `sdpa_attention_forward` (skipping its per-call checks, with the same GQA kernel
choice). Timed as a fourth way of `bench/attention_split.py` (since removed), 7 interleaved
repeats, 2-core CPU: 68.4 vs 74.1 us per later layer at context 512 batch 1 (0.17 ms of a
~64 ms SmolLM2 decode step), within 2% or noise at 4k and 16k: too little for a second copy of
transformers' dispatch.

Where the second call's fixed cost goes (`bench/decode_ops.py`, docs/results/decode_ops.md: one
decode step of SmolLM2's shape at context 512, batch 1): 7,227 aten ops against the source's
6,235, 34 more per later layer, nearly all views (as_strided, transpose, slice: sdpa's own
reshapes of its inputs and output, and the head slices here) at about 1 us each on this CPU,
which is most of the 30 us per layer (77.6 vs 47.8) of docs/results/attention_split.md at 512.

This file is copied next to converted weights with the modeling files, so it imports only torch.
"""

from collections.abc import Callable

import torch


def attend_split(
    attend: Callable, query, key, own_values, borrowed, groups: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`attend(query, key, value) -> (output [batch, q_len, heads, d], weights)` over the own and
    the borrowed head slices; the outputs merged by head, in the layer's head order."""
    own = own_values.shape[1]
    split = own * groups  # query heads served by the own KV heads
    rest, rest_weights = attend(query[:, split:], key[:, own:], borrowed)
    if not own:  # a tensor-parallel rank may hold borrowed heads only
        return rest, rest_weights
    # Two plain calls, no lists or zips: at short context this function's Python overhead shows
    # (a list-and-zip version measured 6 us more per layer at context 512).
    first, first_weights = attend(query[:, :split], key[:, :own], own_values)
    weights = None if first_weights is None else torch.cat((first_weights, rest_weights), dim=1)
    return torch.cat((first, rest), dim=2), weights
