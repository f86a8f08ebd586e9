"""The static decode path (t2r/models/static_decode.py) on CPU: same tokens and logits as generate(),
state updated in place, models with growing K/V caches refused."""

import pytest
import torch

import t2r
from t2r.models.static_decode import StaticDecoder, StaticStateCache, greedy_generate
from tests.helpers.models import tiny_source

# fp32 on CPU: both paths run the same ops (chunkwise prefill, recurrent steps); generate() adds only a mask
# multiply by 1 in the prefill and slices logits differently, so logits agree to rounding.
TOL = dict(rtol=1e-5, atol=1e-5)
N_NEW = 8


def converted(target, **kw):
    """A tiny converted Llama with random new gates (at their init some gates are near-constant)."""
    if target == "gsa":
        kw = {"num_slots": 8, **kw}
    model = t2r.convert(tiny_source("llama"), target, **kw)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".self_attn." in name and not name.split(".self_attn.")[1].startswith(("q_", "k_", "v_", "o_")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval()


def reference(model, ids, mask=None):
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                         do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True,
                         output_logits=True)
    return out.sequences, out.logits


def prompts():
    torch.manual_seed(1)
    a, b = torch.randint(3, 97, (1, 9)), torch.randint(3, 97, (1, 5))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    mask = torch.cat([torch.ones(1, 9), torch.cat([torch.zeros(1, 4), torch.ones(1, 5)], 1)]).long()
    return a, batch, mask


@pytest.mark.parametrize("target,options", [("gsa", {}), ("gla", {}), ("retnet", {}), ("gla", {"rope": True}),
                                            ("gdn", {}), ("gdn", {"conv_size": 0, "output_gate": True})])
@pytest.mark.parametrize("padded", [False, True], ids=["batch1", "batch2-left-padded"])
def test_greedy_tokens_and_logits_equal_generate(target, options, padded):
    model = converted(target, **options)
    single, batch, mask = prompts()
    ids, mask = (batch, mask) if padded else (single, None)
    expected, expected_logits = reference(model, ids, mask)
    tokens, logits = greedy_generate(model, ids, mask, max_new_tokens=N_NEW, eos_token_id=[], return_logits=True)
    assert torch.equal(tokens, expected)
    assert len(logits) == len(expected_logits) == N_NEW
    for got, want in zip(logits, expected_logits):
        torch.testing.assert_close(got, want, **TOL)


def test_padded_rows_generate_as_single_sequences():
    model = converted("gsa")
    single, batch, mask = prompts()
    together = greedy_generate(model, batch, mask, max_new_tokens=N_NEW, eos_token_id=[])
    alone = greedy_generate(model, batch[1:, 4:], max_new_tokens=N_NEW, eos_token_id=[])
    assert torch.equal(together[1, 9:], alone[0, 5:])


def test_stops_at_eos_as_generate_does():
    model = converted("retnet")
    _, batch, mask = prompts()
    free = greedy_generate(model, batch, mask, max_new_tokens=N_NEW, eos_token_id=[])
    eos = int(free[0, 11])  # make row 0's third new token the EOS: row 0 then pads while row 1 goes on
    expected = model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False,
                              eos_token_id=eos, pad_token_id=0)
    got = greedy_generate(model, batch, mask, max_new_tokens=N_NEW, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected)


def test_state_buffers_are_updated_in_place_and_reused():
    model = converted("gsa")
    _, batch, mask = prompts()
    decoder = StaticDecoder(model, batch_size=2)
    assert isinstance(decoder.cache, StaticStateCache) and not decoder.use_cuda_graph
    logits = decoder.prefill(batch, mask)
    buffers = [b for bufs in decoder.cache.buffers.values() for b in bufs]
    assert len(buffers) == 2 * 3  # GSA: K~ and V~ per layer
    ptrs = [b.data_ptr() for b in buffers]
    before = [b.clone() for b in buffers]
    for _ in range(4):
        logits = decoder.step(logits.argmax(-1, keepdim=True))
        assert [b.data_ptr() for bufs in decoder.cache.buffers.values() for b in bufs] == ptrs
    assert all(not torch.equal(a, b) for a, b in zip(before, buffers))  # they did change, in place
    assert decoder.cache.get_seq_length() == 9 + 4
    # a second generation with the same decoder copies into the same buffers and gives the same tokens
    first = greedy_generate(model, batch, mask, max_new_tokens=N_NEW, eos_token_id=[], decoder=decoder)
    again = greedy_generate(model, batch, mask, max_new_tokens=N_NEW, eos_token_id=[], decoder=decoder)
    assert torch.equal(first, again)
    assert [b.data_ptr() for bufs in decoder.cache.buffers.values() for b in bufs] == ptrs


def test_wrong_batch_size_is_refused():
    decoder = StaticDecoder(converted("gla"), batch_size=2)
    with pytest.raises(ValueError, match="batch size 2"):
        decoder.prefill(torch.randint(3, 97, (3, 5)))


@pytest.mark.parametrize("target,layers", [("fox", None), ("gsa", [1])], ids=["fox", "hybrid"])
def test_models_with_growing_kv_caches_are_refused(target, layers):
    model = t2r.convert(tiny_source("llama"), target, layers=layers)
    with pytest.raises(ValueError, match=r"fixed-size state.*(fox|softmax).*model\.generate"):
        StaticDecoder(model, batch_size=1)
    with pytest.raises(ValueError, match="model.generate"):
        greedy_generate(model, torch.randint(3, 97, (1, 5)), max_new_tokens=2)


def test_unconverted_model_is_refused():
    with pytest.raises(ValueError, match="model.generate"):
        StaticDecoder(tiny_source("llama"), batch_size=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # PyTorch ops / Triton kernels
@pytest.mark.parametrize("target", ["gsa", "gla", "retnet", "gdn"])
def test_cuda_graph_replay_equals_the_eager_static_step(target, dtype):
    model = converted(target).to("cuda", dtype)
    _, batch, mask = prompts()
    batch, mask = batch.cuda(), mask.cuda()
    graph = StaticDecoder(model, 2)
    eager = StaticDecoder(model, 2, use_cuda_graph=False)
    got, got_logits = greedy_generate(model, batch, mask, N_NEW, eos_token_id=[], decoder=graph, return_logits=True)
    want, want_logits = greedy_generate(model, batch, mask, N_NEW, eos_token_id=[], decoder=eager,
                                        return_logits=True)
    assert graph.graph is not None and torch.equal(got, want)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # the same kernels; bf16 leaves room for cuBLAS' choice
    for a, b in zip(got_logits, want_logits):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    ptrs = [b.data_ptr() for bufs in graph.cache.buffers.values() for b in bufs]  # a second run replays
    again = greedy_generate(model, batch, mask, N_NEW, eos_token_id=[], decoder=graph)
    assert torch.equal(again, want) and ptrs == [b.data_ptr() for bufs in graph.cache.buffers.values() for b in bufs]
