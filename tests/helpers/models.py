"""Tiny random source models of every supported architecture (built from configs, no download).

`TINY_SOURCES` has one row per registered source (`t2r.ARCHITECTURES`): what its tiny config sets beyond
`COMMON`, and which weights to randomise so that a converted layer that drops one of the source's modules shows.
"""

from dataclasses import dataclass, field
from typing import Callable

import torch

from t2r.layers import MIXERS
from t2r.models import ARCHITECTURES
from tests.helpers.data import char_tokenizer, word_tokenizer

COMMON = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
VOCAB = COMMON["vocab_size"]


@dataclass(frozen=True)
class TinySource:
    """How the tests build a tiny random model of one source architecture."""

    config: dict = field(default_factory=dict)
    """Config fields beyond `COMMON` (overridden by `tiny_source`'s own)."""
    derived: Callable[[dict], dict] = lambda fields: {}
    """Config fields computed from the others (overridden by any given field)."""
    prepare: Callable[[torch.nn.Module], None] = lambda model: None
    """Changes to the random weights (in place, under no_grad) that make a dropped source module show up."""


def same_head_dim(fields: dict) -> dict:
    """Qwen3's and Gemma 3's head_dim defaults to a fixed number, not hidden / heads."""
    return {"head_dim": fields["hidden_size"] // fields["num_attention_heads"]}


def random_qk_norms(model) -> None:
    """q/k norm weights that are not all ones, so a dropped norm shows up."""
    for layer in model.model.layers:
        layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
        layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)


def random_norms(model) -> None:
    """Gemma's norms start at zero (it scales by 1 + w): make them matter."""
    for name, param in model.named_parameters():
        if "norm" in name:
            param.uniform_(-0.5, 0.5)


TINY_SOURCES = {
    "llama": TinySource(),
    "mistral": TinySource({"sliding_window": 16}),
    "qwen2": TinySource(),
    "qwen3": TinySource(derived=same_head_dim, prepare=random_qk_norms),
    "phi3": TinySource({"partial_rotary_factor": 0.5}),  # fused qkv_proj, RoPE on half of each head
    "gemma3_text": TinySource(
        {"query_pre_attn_scalar": 12, "sliding_window": 16},  # a scale that is not head_dim: ignoring it shows
        derived=lambda fields: {**same_head_dim(fields), "layer_types": [
            "full_attention" if i % 2 else "sliding_attention" for i in range(fields["num_hidden_layers"])]},
        prepare=random_norms),
}


def tiny_source(arch: str, seed: int = 0, **overrides):
    """A tiny random source model of `arch` (a key of `t2r.ARCHITECTURES`), in eval mode."""
    if arch not in TINY_SOURCES:
        raise KeyError(f"no tiny {arch!r} source: add a row to TINY_SOURCES in tests/helpers/models.py")
    row = TINY_SOURCES[arch]
    config_class, _, causal_lm_class = ARCHITECTURES[arch].source_classes
    torch.manual_seed(seed)
    fields = {**COMMON, **row.config, **overrides}
    model = causal_lm_class(config_class(**{**row.derived(fields), **fields}))
    with torch.no_grad():
        row.prepare(model)
        # a pad embedding that is not zero, so missing padding masks show up
        model.get_input_embeddings().weight[COMMON["pad_token_id"]].normal_()
    return model.eval()


ARCHS = tuple(ARCHITECTURES)  # every registered source
TARGETS = tuple(MIXERS)  # every registered target


def small(target: str) -> dict:
    """Options that keep a tiny model tiny: 8 GSA slots (other targets have no slots)."""
    return {"num_slots": 8} if "num_slots" in MIXERS[target].options.field_names() else {}


TOKENIZERS = {"chars": char_tokenizer, "words": word_tokenizer}


def save_tiny_source(path, tokenizer: str = "chars"):
    """A tiny random Llama with a tokenizer, saved at `path` like a hub checkpoint; returns `path`.

    chars: `char_tokenizer` (any text; the vocabulary shrinks to its 95 ids); words: `word_tokenizer` ("w0" ...
    "w96" split at whitespace: the tiny model's 97 ids, so `tiny_source("llama")` is the saved model)."""
    tok = TOKENIZERS[tokenizer]()
    tiny_source("llama", vocab_size=len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


WINDOW = dict(window=5, sinks=2)


def windowed(arch, target, seed=7, **kw):
    """A converted tiny model with window + sinks (`WINDOW`, overridden by `kw`) whose new parameters (gates and the
    window gain, which starts at 0 and would hide the state) are drawn at random."""
    import t2r
    from t2r.train.model_setup import new_module_names

    model = t2r.convert(tiny_source(arch), target, **small(target), **{**WINDOW, **kw})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in new_module_names(model):
            for layer in model.converted_layers().values():
                for p in getattr(layer, name).parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Token ids for the tiny models: 3 ... 96 (0-2 are pad, bos and eos)."""
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids, mask=None, n=8):
    """`n` greedy tokens; min_new_tokens: no early stop at EOS, so batched and single runs give the same lengths."""
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0)
