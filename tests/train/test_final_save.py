"""`final/` from weights gathered as FSDP gathers them: each tensor a copy of its own, tied ones included."""

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import t2r
from t2r.train.export import save_final, without_tied_copies
from tests.helpers.models import char_tokenizer, small, tiny_source


def gathered(model) -> dict[str, torch.Tensor]:
    """The full state dict as FSDP's gather returns it: every entry its own tensor (no shared storage)."""
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.mark.parametrize("tie", [True, False])
def test_a_gathered_state_dict_saves_a_tied_head_once(tmp_path, tie):
    """A tied output head (SmolLM2's) gathered as its own copy is saved once, and the directory loads to the same
    logits; an untied head is kept."""
    tokenizer = char_tokenizer()
    model = t2r.convert(tiny_source("llama", vocab_size=len(tokenizer), tie_word_embeddings=tie), "gsa",
                        **small("gsa"))
    state = gathered(model)
    assert "lm_head.weight" in state  # what the two-card final/ held beside the embedding
    accelerator = SimpleNamespace(get_state_dict=lambda m: state, is_main_process=True, unwrap_model=lambda m: m)
    final = save_final(accelerator, model, tokenizer, tmp_path, write_extra=lambda path: None)
    saved = load_file(final / "model.safetensors")
    assert ("lm_head.weight" in saved) is not tie
    loaded = AutoModelForCausalLM.from_pretrained(final).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits)


def test_a_tied_copy_that_differs_is_kept():
    model = tiny_source("llama", tie_word_embeddings=True)
    state = gathered(model)
    assert "lm_head.weight" not in without_tied_copies(model, state)
    state["lm_head.weight"] += 1.0  # no longer the embedding: nothing that differs is dropped
    assert "lm_head.weight" in without_tied_copies(model, state)
