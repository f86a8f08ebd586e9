"""A layer ranking's candidates side by side in one forward.

A candidate of `t2r.convert.sensitivity.rank_layers` is the all-converted model with the source's attention put
back in some layers (`keep_softmax`). Run one by one, 31 candidates of SmolLM2 cost 62 forwards of a few thousand
tokens each, and on a GPU each forward is bound by its kernel launches, not its arithmetic (0.3 s a candidate on
an H100, most of a warm ranking). Here the rows of G candidates are laid end to end as one packed sequence, block
g holding candidate g's copy of the rows, and each layer computes, in each block, what that block's candidate
computes there: the converted mixer's output, the source attention's, or (`MixedAttention`, where the candidates
of the group disagree on the layer) both, taking each block's own. Every row is a document of its own
(`cu_seq_lens_q`), so no token sees another block's: candidate g's logits are those it has alone, up to rounding.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from t2r.models.compilation import decoder_layers

GROUP_TOKENS = 16384
"""Tokens of one side-by-side forward (candidates x rows x length): its logits are ~1.6 GB in bf16 at SmolLM2's
49K words."""


class MixedAttention(nn.Module):
    """One layer's attention over blocks of `block` tokens, one block per candidate: the source attention's output
    in the blocks whose candidate keeps the layer (`keeps`), the converted mixer's in the others."""

    def __init__(self, softmax: nn.Module, converted: nn.Module, keeps: list[bool], block: int):
        super().__init__()
        self.softmax, self.converted = softmax, converted
        # which token takes the source's output, built once where the layer is: a tensor copied from the host
        # (as each forward did) waits for the device's queue, once per mixed layer and forward
        device = next(softmax.parameters(), torch.empty(0)).device
        where = torch.tensor(keeps, device=device).repeat_interleave(block).view(1, -1, 1)
        self.register_buffer("where", where, persistent=False)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        kept, _ = self.softmax(hidden_states, attention_mask=attention_mask, **kwargs)
        # the mask passed is the softmax layers' (causal, by documents); a converted layer's is the padding mask,
        # and a ranking's rows have no padding
        mixed, _ = self.converted(hidden_states, attention_mask=None, **kwargs)
        return torch.where(self.where, kept, mixed), None


def row_logits(model, rows: torch.Tensor, packed: bool = False) -> torch.Tensor:
    """The logits `[B, L, vocab]` of `rows` `[B, L]`, each row its own document. `packed`: the rows laid end to end
    as one sequence `[1, B * L]` with their starts in `cu_seq_lens_q`, as training's batches are
    (`t2r.data.packing.collate_packed`): the mixers run the varlen kernels of training and of its held-out loss
    and the softmax layers varlen attention (inside `packed_attention`, which the caller holds). The same
    function."""
    if not packed:
        return model(rows, use_cache=False).logits
    count, length = rows.shape
    starts = torch.arange(0, (count + 1) * length, length, dtype=torch.int32, device=rows.device)
    positions = torch.arange(length, device=rows.device).repeat(count)[None]
    out = model(rows.reshape(1, -1), position_ids=positions, cu_seq_lens_q=starts, cu_seq_lens_k=starts,
                max_length_q=length, max_length_k=length, use_cache=False)
    return out.logits.view(count, length, -1)


def kl_sum(logits: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """KL(reference || model) summed over the predicted tokens of rows: `logits` `[B, L, vocab]` of the model,
    `log_p` `[B, L - 1, vocab]` the reference's log-probs of the next tokens."""
    return F.kl_div(F.log_softmax(logits[:, :-1].float(), -1), log_p, log_target=True, reduction="sum")


def answer_loss_sum(logits: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token loss summed over the positions `mask` `[B, L - 1]` marks: `logits` `[B, L, vocab]` of `rows`."""
    per_token = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), rows[:, 1:], reduction="none")
    return per_token[mask].sum()


def can_mix(converted) -> bool:
    """Whether a layer may hold a mix: every layer type gets the same rotary embedding (in a model whose rotary
    embedding depends on the layer type, the two halves of a mixed layer would want different ones)."""
    return not getattr(getattr(converted, "model", converted), "rotary_per_layer_type", False)


@contextlib.contextmanager
def side_by_side(converted, source, kept: list[list[int]], block: int | None = None):
    """Inside, `converted` (every layer converted from `source`) computes candidate g (the source's attention in
    the layers `kept[g]`, with their layer types, so each gets the mask it expects) in block g of its input,
    blocks of `block` tokens; one candidate needs no blocks (the conversion of the other layers alone, without
    converting again). The gates of the converted layers are those of the one conversion, so for targets whose
    fresh layers depend on random draws (GSA's slots) a candidate differs from `convert(source, layers=...)` in
    those draws only; with a window (every gain 0), or a closed forget gate, the two are the same model."""
    if len(kept) > 1 and block is None:
        raise ValueError("candidates side by side need the tokens of a block")
    decoder, original = decoder_layers(converted), decoder_layers(source)
    types = converted.config.layer_types if converted.config.layer_types is not None else [None] * len(decoder)
    source_types = getattr(source.config, "layer_types", None) or ["full_attention"] * len(original)
    sets = [set(layers) for layers in kept]
    saved = [(i, decoder[i].self_attn, types[i]) for i in range(len(decoder))]
    try:
        for i in range(len(decoder)):
            keeps = [i in layers for layers in sets]
            if all(keeps):
                decoder[i].self_attn = original[i].self_attn
            elif any(keeps):
                decoder[i].self_attn = MixedAttention(original[i].self_attn, decoder[i].self_attn, keeps, block)
            if any(keeps):
                types[i] = source_types[i]
        yield converted
    finally:
        for i, attention, kind in saved:
            decoder[i].self_attn, types[i] = attention, kind


@torch.no_grad()
def scores_side_by_side(converted, source, kept: list[list[int]], input_ids: torch.Tensor,
                        reference: list[torch.Tensor], recall: tuple[torch.Tensor, torch.Tensor] | None,
                        batch_size: int, packed: bool = True) -> tuple[list[float], list[float] | None]:
    """Per candidate (`kept`, as `side_by_side` takes them): the mean KL(reference || candidate) per predicted token
    of `input_ids` (`reference`: the source's log-probs of each batch of `batch_size` rows) and, with `recall`
    (ids, answer mask), the mean loss of the answers, from one packed forward per batch of rows (under
    `packed_attention` on a GPU, as `rank_layers` holds it). Unpacked, one candidate at a time."""
    if len(kept) > 1 and not packed:
        raise ValueError("candidates side by side run packed")
    device = next(converted.parameters()).device
    count = len(kept)
    kl = torch.zeros(count, dtype=torch.float64, device=device)
    tokens = 0
    for start, log_p in zip(range(0, len(input_ids), batch_size), reference):
        rows = input_ids[start:start + batch_size].to(device)
        for g, piece in enumerate(_candidates_logits(converted, source, kept, rows, packed)):
            kl[g] += kl_sum(piece, log_p.to(device))
        tokens += log_p.shape[0] * log_p.shape[1]
    if recall is None:
        return (kl / tokens).tolist(), None
    ids, answers = recall
    loss = torch.zeros(count, dtype=torch.float64, device=device)
    answered = 0
    for start in range(0, len(ids), batch_size):
        rows, mask = ids[start:start + batch_size].to(device), answers[start:start + batch_size, 1:].to(device)
        for g, piece in enumerate(_candidates_logits(converted, source, kept, rows, packed)):
            loss[g] += answer_loss_sum(piece, rows, mask)
        answered += int(mask.sum())
    return (kl / tokens).tolist(), (loss / max(answered, 1)).tolist()


def _candidates_logits(converted, source, kept, rows: torch.Tensor, packed: bool) -> torch.Tensor:
    """`[candidates, rows, length, vocab]`: each candidate's logits of `rows`, from one forward."""
    count, (batch, length) = len(kept), rows.shape
    with side_by_side(converted, source, kept, batch * length):
        logits = row_logits(converted, rows.repeat(count, 1), packed)
    return logits.view(count, batch, length, -1)


def group_size(rows: int, length: int, converted) -> int:
    """Candidates per side-by-side forward of `rows` x `length` tokens (`GROUP_TOKENS`); 1 where layers cannot mix."""
    return max(1, GROUP_TOKENS // max(1, rows * length)) if can_mix(converted) else 1
