"""A fast greedy decode path for converted models whose layers all keep a fixed-size state (the registered
targets whose `MixerSpec.constant_memory` is set).

Decoding through the eager forward costs about 1 ms per layer of Python and kernel-launch overhead on a GPU,
which hides what the recurrent state saves. A fixed-size state can live in preallocated buffers that every step
updates in place, so one decode step has fixed inputs, outputs and state addresses and can be captured once in
a `torch.cuda.CUDAGraph` and replayed: one launch per token instead of hundreds. Softmax and FoX layers keep a
K/V cache that grows every token and cannot live in fixed buffers; models with them use `model.generate`.

    decoder = StaticDecoder(model, batch_size=16)          # captures the step on its first CUDA decode
    tokens = greedy_generate(model, input_ids, attention_mask, max_new_tokens=64, decoder=decoder)
"""

from __future__ import annotations

import torch

from t2r.layers import MIXERS, get_mixer
from t2r.models.generation_cache import T2RCache


def fixed_state_targets() -> list[str]:
    """The registered targets that keep a fixed-size state (`MixerSpec.constant_memory`)."""
    return [name for name, spec in MIXERS.items() if spec.constant_memory]


def check_static_decodable(model) -> None:
    """Raise ValueError unless every layer of `model` is a fixed-state mixer (`fixed_state_targets`)."""
    mixers = getattr(model.config, "t2r_mixers", None)
    fixed = ", ".join(fixed_state_targets())
    if mixers is None:
        raise ValueError(f"static decoding needs a model converted by t2r.convert with every layer one of {fixed}; "
                         "this is an unconverted (softmax) model: use model.generate(...) instead")
    others = {i: m for i, m in enumerate(mixers) if m == "softmax" or not get_mixer(m).constant_memory}
    if others:
        listed = ", ".join(f"{i} ({m})" for i, m in others.items())
        raise ValueError(
            f"static decoding needs every layer to keep a fixed-size state ({fixed}), but layer(s) {listed} "
            "keep a K/V cache that grows every token, which cannot live in the fixed buffers a "
            "CUDA graph replays; use model.generate(...) instead")
    windowed = [i for i, m in enumerate(mixers) if getattr(model.config.mixer_options(i), "window", 0)]
    if windowed:
        raise ValueError(f"static decoding keeps only the recurrent state in fixed buffers, but layer(s) {windowed} "
                         "also read a window of recent tokens (window > 0); use model.generate(...) instead")


class StaticStateCache(T2RCache):
    """A `T2RCache` whose recurrent states live in fixed buffers that `set_state` updates in place (`copy_`).

    A decode step then allocates no new persistent state and reads and writes the same addresses every time,
    which is what lets a CUDA graph replay it. The buffers are allocated by the first `load_` from the cache of
    an eager prefill and reused (copied into) by every later one. The token count is kept by the caller
    (`seen_tokens`), since a replayed graph runs no Python.
    """

    def __init__(self, config):
        super().__init__(config)
        self.buffers: dict[int, tuple[torch.Tensor, ...]] = {}
        self.seen_tokens = 0

    @torch.no_grad()
    def load_(self, cache, num_layers: int) -> None:
        """Copy the states of a filled cache (e.g. a prefill's `T2RCache`) into the buffers."""
        for layer_idx in range(num_layers):
            state = cache.get_state(layer_idx)
            if state is None:
                raise ValueError(f"layer {layer_idx} of the prefill cache holds no state; prefill at least one token")
            states = state if isinstance(state, tuple) else (state,)
            if layer_idx not in self.buffers:
                self.buffers[layer_idx] = tuple(s.detach().clone(memory_format=torch.contiguous_format) for s in states)
                continue
            for buf, s in zip(self.buffers[layer_idx], states, strict=True):
                if buf.shape != s.shape:
                    raise ValueError(f"layer {layer_idx}: state {tuple(s.shape)} does not fit the buffer "
                                     f"{tuple(buf.shape)} (another batch size?); build a StaticDecoder for it")
                buf.copy_(s)
        self.seen_tokens = cache.get_seq_length()

    def get_state(self, layer_idx: int):
        states = self.buffers.get(layer_idx)
        if states is None:
            return None
        return states[0] if len(states) == 1 else states

    def set_state(self, layer_idx: int, state, num_new_tokens: int) -> None:
        if layer_idx not in self.buffers:
            raise RuntimeError("StaticStateCache.set_state before load_: prefill with a T2RCache and load_ it first")
        states = state if isinstance(state, tuple) else (state,)
        for buf, s in zip(self.buffers[layer_idx], states, strict=True):
            buf.copy_(s)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens


class StaticDecoder:
    """`step(input_ids [B,1]) -> logits [B,V]` of one decode token, through `model.forward` on static buffers.

    On CUDA (unless `use_cuda_graph=False`) the step is captured once in a CUDA graph, after a warm-up on a side
    stream (Triton compiles there, not in the capture), and replayed; elsewhere the same static step runs
    eagerly. Positions live in a static buffer too (advanced outside the graph), so layers with `rope=True` see
    the right ones. The returned logits are a static buffer, overwritten by the next step.
    """

    def __init__(self, model, batch_size: int, use_cuda_graph: bool | None = None, warmup_steps: int = 3):
        check_static_decodable(model)
        self.model, self.batch_size, self.warmup_steps = model, batch_size, warmup_steps
        self.device = next(model.parameters()).device
        self.use_cuda_graph = self.device.type == "cuda" if use_cuda_graph is None else use_cuda_graph
        self.cache = StaticStateCache(model.config)
        self.input_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)
        self.position_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)
        self.logits: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Eager forward of the prompt (left padding allowed) into the static state; last-position logits [B,V]."""
        if input_ids.shape[0] != self.batch_size:
            raise ValueError(f"this StaticDecoder was built for batch size {self.batch_size}, got {input_ids.shape[0]}")
        if attention_mask is not None:  # positions as generate() makes them: padding does not count
            positions = attention_mask.long().cumsum(-1) - 1
            positions = positions.masked_fill(attention_mask == 0, 0)
        else:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
        cache = T2RCache(self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.cache.load_(cache, self.model.config.num_hidden_layers)
        self.position_ids.copy_(positions[:, -1:] + 1)
        return out.logits[:, -1]

    def _forward(self) -> torch.Tensor:
        return self.model(input_ids=self.input_ids, position_ids=self.position_ids, past_key_values=self.cache,
                          use_cache=True).logits[:, -1]

    def _capture(self) -> None:
        saved = {i: tuple(b.clone() for b in bufs) for i, bufs in self.cache.buffers.items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: Triton compiles, allocator settles
            for _ in range(self.warmup_steps):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()
        for i, bufs in saved.items():  # the warm-up advanced the state: put the prefilled one back
            for buf, s in zip(self.cache.buffers[i], bufs):
                buf.copy_(s)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed one token per sequence ([B,1]); returns the next-token logits [B,V] (a static buffer)."""
        if not self.cache.buffers:
            raise RuntimeError("StaticDecoder.step before prefill(): the state buffers are not filled yet")
        self.input_ids.copy_(input_ids)
        if self.use_cuda_graph:
            if self.graph is None:
                self._capture()
            self.graph.replay()
        else:
            self.logits = self._forward()
        self.position_ids.add_(1)
        self.cache.seen_tokens += 1
        return self.logits


@torch.no_grad()
def greedy_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    max_new_tokens: int = 20, eos_token_id=None, pad_token_id: int | None = None,
                    decoder: StaticDecoder | None = None, return_logits: bool = False):
    """Greedy decoding through a `StaticDecoder`: the tokens of `model.generate(..., do_sample=False)`
    (prompt + new tokens, stopping when every sequence has produced EOS, finished ones padded).

    No logits processors are applied (repetition penalty, min length, ...). `eos_token_id` / `pad_token_id`
    default to the model's generation config; pass `eos_token_id=[]` never to stop early. Pass `decoder` to
    reuse its buffers and captured graph across calls. With `return_logits`, also the fp32 logits of each step.
    """
    decoder = decoder or StaticDecoder(model, input_ids.shape[0])
    gen = model.generation_config
    eos = gen.eos_token_id if eos_token_id is None else eos_token_id
    eos = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=input_ids.device)
    pad = pad_token_id if pad_token_id is not None else gen.pad_token_id
    pad = pad if pad is not None else (int(eos[0]) if len(eos) else 0)
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    logits, tokens, all_logits = decoder.prefill(input_ids, attention_mask), [], []
    for i in range(max_new_tokens):
        if return_logits:
            all_logits.append(logits.float().clone())
        next_token = logits.argmax(-1)
        next_token = torch.where(unfinished, next_token, pad)
        tokens.append(next_token)
        if len(eos):
            unfinished &= ~torch.isin(next_token, eos)
            if not unfinished.any():
                break
        if i + 1 < max_new_tokens:
            logits = decoder.step(next_token[:, None])
    sequences = torch.cat([input_ids, torch.stack(tokens, 1)], 1)
    return (sequences, all_logits) if return_logits else sequences
