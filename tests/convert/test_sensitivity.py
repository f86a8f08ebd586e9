"""Layer sensitivity ranking: the measure itself, the auto:N choice, and its command-line and recipe entries."""

import json

import pytest
import torch

from t2r.cli import main
from t2r.convert import calibration
from t2r.convert.calibration import resolve_layers
from t2r.convert.sensitivity import LayerRanking, rank_layers
from tests.helpers.data import write_words
from tests.helpers.models import save_tiny_source, tiny_source

IDS = torch.randint(3, 97, (3, 20), generator=torch.Generator().manual_seed(0))


def test_a_layer_whose_attention_is_silenced_costs_nothing_to_convert():
    """Zeroing layer 1's output projection makes its attention irrelevant: converting it must cost exactly 0,
    and it ranks last; the other layers cost something."""
    source = tiny_source("llama")
    with torch.no_grad():
        source.model.layers[1].self_attn.o_proj.weight.zero_()
    ranking = rank_layers(source, "gsa", IDS, batch_size=2, progress=False, num_slots=4)
    assert len(ranking.kl) == 3 and ranking.tokens == 3 * 19
    assert ranking.kl[1] == pytest.approx(0.0, abs=1e-9)
    assert min(ranking.kl[0], ranking.kl[2]) > 1e-4
    assert 1 not in ranking.most_sensitive(2) and ranking.converted_layers(2) == [1]


def test_fox_with_a_closed_forget_gate_is_the_source_at_every_layer():
    ranking = rank_layers(tiny_source("qwen3"), "fox", IDS, progress=False, fox_gate_bias=30.0)
    assert max(ranking.kl) < 1e-6


def test_a_ranking_off_a_terminal_says_a_line_per_candidate(capsys):
    """No bar shows in a log file or a notebook (stderr is not a terminal there, nor under capsys): a line before
    the source's forward, one when the candidates begin, then one per candidate with its scores and the time left
    (a CPU ranking of SmolLM2 ran 504 s without a line); none with progress=False."""
    ranking = rank_layers(tiny_source("llama"), "gla", IDS, batch_size=2, recall=RECALL, criterion="kl+recall",
                          gate_low_rank_dim=4)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 2 + 3, lines
    assert lines[0] == "rank layers (gla, convert-one): 3 candidates on 3 rows of 20 tokens and 3 recall prompts " \
                       "(cpu); the source's log-probs and one conversion first"
    assert lines[1].startswith("rank layers (gla, convert-one): ready in ") and lines[1].endswith("3 candidates follow")
    for layer, line in enumerate(lines[2:]):
        assert line.startswith(f"rank layers (gla, convert-one): layer {layer} ({layer + 1}/3): "
                               f"KL {ranking.kl[layer]:.4f}, recall {ranking.recall[layer]:.4f}; ")
        assert line.endswith(" left") and " s each, " in line
    assert lines[-1].endswith("0m00s left")
    rank_layers(tiny_source("llama"), "gla", IDS, batch_size=2, progress=False, gate_low_rank_dim=4)
    assert capsys.readouterr().err == ""


def test_most_sensitive_and_converted_layers():
    ranking = LayerRanking("gsa", kl=[0.3, 0.1, 0.5, 0.2], tokens=10)
    assert ranking.most_sensitive(2) == [0, 2] and ranking.converted_layers(2) == [1, 3]
    assert ranking.converted_layers(0) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="keep between 0 and 3 of 4 layers"):
        ranking.most_sensitive(4)


def test_write_saves_json_and_plot(tmp_path):
    LayerRanking("gla", kl=[0.3, 0.1, 0.5], tokens=10).write(tmp_path, softmax_count=1)
    saved = json.loads((tmp_path / "ranking.json").read_text())
    assert (saved["order"], saved["softmax_layers"], saved["target"]) == ([2, 0, 1], [2], "gla")
    assert (tmp_path / "ranking.png").stat().st_size > 1000


def test_resolve_layers_reuses_a_saved_ranking_for_the_same_calibration(tmp_path, monkeypatch):
    source = tiny_source("llama")
    tokenizer_calls = []
    monkeypatch.setattr(calibration, "calibration_rows", lambda *a, **k: tokenizer_calls.append(1) or IDS)
    first = resolve_layers("auto:1", source, None, "gsa", out_dir=tmp_path, progress=False, num_slots=4)
    assert len(first) == 2 and tokenizer_calls == [1]
    monkeypatch.setattr(calibration, "rank_layers", lambda *a, **k: pytest.fail("ranked again"))
    assert resolve_layers("auto:1", source, None, "gsa", out_dir=tmp_path, num_slots=4) == first
    assert resolve_layers("0,2", source, None, "gsa", out_dir=tmp_path) == "0,2"  # not auto: untouched
    with pytest.raises(ValueError, match="keep between 0 and 2 of 3 layers"):
        resolve_layers("auto:3", source, None, "gsa")


def test_command_line_ranks_and_converts_with_auto_layers(tmp_path, capsys):
    save_tiny_source(tmp_path / "src", tokenizer="words")
    data = write_words(tmp_path / "text.jsonl")
    common = ["--model", str(tmp_path / "src"), "--to", "gsa", "--num-slots", "4", "--device", "cpu",
              "--data", str(data), "--calibration-rows", "2", "--calibration-length", "64"]
    assert main(["rank-layers", *common, "--out", str(tmp_path / "rank"), "--keep", "1"]) == 0
    printed = capsys.readouterr().out
    ranking = json.loads((tmp_path / "rank" / "ranking.json").read_text())
    assert f"keep as softmax: {ranking['softmax_layers']}" in printed and len(ranking["kl"]) == 3
    assert main(["convert", *common, "--layers", "auto:1", "--out", str(tmp_path / "hybrid")]) == 0
    config = json.loads((tmp_path / "hybrid" / "config.json").read_text())
    kept = [i for i, m in enumerate(config["t2r_mixers"]) if m == "softmax"]
    assert kept == ranking["softmax_layers"]  # same text, same ranking
    assert (tmp_path / "hybrid" / "layer_ranking" / "ranking.png").is_file()


def test_recipes_accept_auto_layers():
    from t2r.train.recipe import RecipeError
    from tests.helpers.recipes import make_recipe

    assert make_recipe("convert.layers=auto:2").convert.layers == "auto:2"
    with pytest.raises(RecipeError, match="or 'auto:N'"):
        make_recipe("convert.layers=auto:two")


def test_a_recipe_with_auto_layers_builds_the_ranked_hybrid(tmp_path, source_dir, corpus):
    from t2r.train.model_setup import build_model
    from tests.helpers.recipes import recipe

    tiny = recipe(tmp_path, source_dir, corpus, **{"convert.layers": "auto:1"})
    model, _, _ = build_model(tiny)
    saved = json.loads((tmp_path / "run" / "layer_ranking" / "ranking.json").read_text())
    assert [i for i, m in enumerate(model.config.t2r_mixers) if m == "softmax"] == saved["softmax_layers"]
    assert saved["calibration"] == {"data": str(corpus), "rows": 4, "length": 32}


@pytest.mark.parametrize("overrides", [
    {"stages.distill": "{weight: 1.0}", "model.dtype": "bfloat16", "train.mixed_precision": "bf16"},
    {"stages.distill": "{weight: 1.0}"},          # float32 teacher, float32 student: must not share
])
def test_student_and_teacher_never_share_weights(tmp_path, source_dir, corpus, overrides):
    from t2r.train.model_setup import build_model
    from tests.helpers.recipes import recipe

    model, _, teacher = build_model(recipe(tmp_path, source_dir, corpus, **overrides))
    teacher_pointers = {p.data_ptr() for p in teacher.parameters()}
    assert not any(p.data_ptr() in teacher_pointers for p in model.parameters())


RECALL = (IDS, torch.zeros_like(IDS, dtype=torch.bool).index_fill_(1, torch.tensor([9, 14, 19]), True))


def test_recall_cost_is_the_answer_loss_a_layer_adds():
    """With o_proj of layer 1 zeroed, converting it leaves every answer's loss exactly as the source's (cost 0);
    the recall criterion orders layers by their cost. The cost is the loss at the marked positions only."""
    from t2r.convert.sensitivity import answer_loss

    source = tiny_source("llama")
    with torch.no_grad():
        source.model.layers[1].self_attn.o_proj.weight.zero_()
    ranking = rank_layers(source, "gsa", IDS, batch_size=2, progress=False, recall=RECALL, criterion="recall",
                          num_slots=4)
    assert ranking.recall[1] == pytest.approx(0.0, abs=1e-6) and min(ranking.recall[0], ranking.recall[2]) != 0
    assert ranking.order() == sorted(range(3), key=lambda i: -ranking.recall[i])
    logits = source(IDS, use_cache=False).logits[:, :-1]
    by_hand = torch.nn.functional.cross_entropy(logits[:, [8, 13, 18]].reshape(-1, logits.shape[-1]),
                                                IDS[:, [9, 14, 19]].reshape(-1))
    assert answer_loss(source, *RECALL, batch_size=2) == pytest.approx(by_hand.item(), rel=1e-5)


def test_criteria_rank_by_what_they_say():
    ranking = LayerRanking("gdn", kl=[5.0, 0.1, 0.2, 0.4], tokens=10, recall=[2.0, 1.0, 0.02, 0.8])
    assert ranking.most_sensitive(1) == [0]                                  # kl
    ranking.criterion = "recall"
    assert ranking.order() == [0, 1, 3, 2]
    ranking.criterion = "halo"                                              # recall over kl, capped at 50
    assert ranking.scores() == pytest.approx([0.4, 10.0, 0.1, 2.0]) and ranking.most_sensitive(2) == [1, 3]
    assert LayerRanking("gdn", [1e-9], 1, recall=[1.0], criterion="halo").scores() == [50.0]
    ranking.criterion = "kl+recall"
    assert ranking.scores()[0] == pytest.approx(5.0 / 1.425 + 2.0 / 0.955)
    with pytest.raises(ValueError, match="needs recall costs"):
        LayerRanking("gdn", kl=[1.0], tokens=1, criterion="halo").scores()
    with pytest.raises(ValueError, match="choose one of kl, recall, halo, kl\\+recall"):
        LayerRanking("gdn", kl=[1.0], tokens=1, criterion="ratio").scores()
    with pytest.raises(ValueError, match="needs recall prompts"):
        rank_layers(tiny_source("llama"), "gsa", IDS, progress=False, criterion="halo")


def test_a_saved_ranking_is_reused_only_for_the_same_criterion(tmp_path, monkeypatch):
    source = tiny_source("llama")
    monkeypatch.setattr(calibration, "calibration_rows", lambda *a, **k: IDS)
    monkeypatch.setattr(calibration, "recall_rows", lambda *a, **k: RECALL)
    by_kl = resolve_layers("auto:1", source, None, "gsa", out_dir=tmp_path, progress=False, num_slots=4)
    ranked = []
    real = calibration.rank_layers
    monkeypatch.setattr(calibration, "rank_layers", lambda *a, **k: ranked.append(k["criterion"]) or real(*a, **k))
    by_recall = resolve_layers("auto:1", source, None, "gsa", out_dir=tmp_path, progress=False, rank_by="recall",
                               num_slots=4)
    assert ranked == ["recall"] and len(by_recall) == len(by_kl) == 2
    saved = json.loads((tmp_path / "ranking.json").read_text())
    assert saved["criterion"] == "recall" and len(saved["recall"]) == 3
    assert resolve_layers("auto:1", source, None, "gsa", out_dir=tmp_path, rank_by="recall", num_slots=4) == by_recall
    assert ranked == ["recall"]


def test_answer_rows_mark_the_answer_tokens():
    from t2r.data.recall_prompts import RecallExample, answer_rows

    ids, mask = answer_rows([RecallExample([1, 2, 3, 4], [[2], [3]]), RecallExample([5, 6], [[1]])])
    assert ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert mask.tolist() == [[False, False, True, True], [False, True, False, False]]


def test_recipes_and_the_command_line_take_rank_by():
    from t2r.cli.parser import build_parser
    from t2r.train.recipe import RecipeError
    from tests.helpers.recipes import make_recipe

    assert make_recipe("convert.rank_by=halo").convert.rank_by == "halo"
    with pytest.raises(RecipeError, match="rank_by"):
        make_recipe("convert.rank_by=ratio")
    args = build_parser().parse_args(["rank-layers", "--to", "gdn", "--out", "x", "--rank-by", "kl+recall"])
    assert args.rank_by == "kl+recall" and args.rank_sweep == "convert-one"
    assert make_recipe("convert.rank_sweep=keep-one").convert.rank_sweep == "keep-one"


def test_keep_one_measures_what_keeping_a_layer_buys_back():
    """keep-one: KL and recall loss of the all-converted model minus those with one layer kept softmax (the
    source's attention put back into the one conversion, so the other layers keep the same gates). Layer 1 with
    a zeroed o_proj adds nothing whether kept or converted: its gains are exactly 0."""
    import copy

    from t2r.convert import convert
    from t2r.convert.sensitivity import answer_loss, kl_to_reference

    source = tiny_source("llama")
    with torch.no_grad():
        source.model.layers[1].self_attn.o_proj.weight.zero_()
    ranking = rank_layers(source, "gsa", IDS, batch_size=3, progress=False, recall=RECALL, sweep="keep-one",
                          criterion="kl+recall", num_slots=4)
    assert ranking.sweep == "keep-one"
    assert ranking.kl[1] == 0 and ranking.recall[1] == 0 and max(map(abs, ranking.kl)) > 1e-4
    reference = [torch.log_softmax(source(IDS, use_cache=False).logits[:, :-1].float(), -1)]

    def seeded(layers):  # as rank_layers converts: each conversion from seed 0
        torch.manual_seed(0)
        return convert(source, "gsa", layers=layers, num_slots=4).eval()

    every = seeded([0, 1, 2])
    kept_0 = copy.deepcopy(every)
    kept_0.model.layers[0].self_attn = copy.deepcopy(source.model.layers[0].self_attn)
    kept_0.config.layer_types[0] = "full_attention"
    expected = kl_to_reference(every, IDS, reference, 3) - kl_to_reference(kept_0, IDS, reference, 3)
    assert ranking.kl[0] == pytest.approx(expected, rel=1e-4)
    expected = answer_loss(every, *RECALL, 3) - answer_loss(kept_0, *RECALL, 3)
    assert ranking.recall[0] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match="choose one of convert-one, keep-one"):
        rank_layers(source, "gsa", IDS, progress=False, sweep="drop-one")


@pytest.mark.parametrize("sweep", ["keep-one", "convert-one"])
def test_one_conversion_ranks_as_a_conversion_per_candidate(sweep):
    """The ranking converts once and puts the source's attention back per candidate; with a window (gains start
    at 0) a fresh conversion does not depend on its random draws, so every candidate must score exactly as its
    own conversion, `t2r.convert(source, layers=...)`, the way the ranking measured before."""
    from t2r import convert
    from t2r.convert.sensitivity import answer_loss, kl_to_reference

    source = tiny_source("llama").eval()
    options = dict(window=4, sinks=1)
    ranking = rank_layers(source, "gdn", IDS, batch_size=2, progress=False, recall=RECALL, criterion="kl+recall",
                          sweep=sweep, **options)
    reference = [torch.log_softmax(source(IDS[s:s + 2], use_cache=False).logits[:, :-1].float(), -1)
                 for s in range(0, len(IDS), 2)]
    layers = source.config.num_hidden_layers

    def scores(converted_layers):
        model = convert(source, "gdn", layers=converted_layers, **options).eval()
        with torch.no_grad():
            return kl_to_reference(model, IDS, reference, 2), answer_loss(model, *RECALL, 2)

    if sweep == "keep-one":
        base = scores(list(range(layers)))
        expected = [[b - s for b, s in zip(base, scores([i for i in range(layers) if i != layer]))]
                    for layer in range(layers)]
    else:
        with torch.no_grad():
            base_recall = answer_loss(source, *RECALL, 2)
        expected = [[s - b for s, b in zip(scores([layer]), (0.0, base_recall))] for layer in range(layers)]
    assert ranking.kl == pytest.approx([e[0] for e in expected], rel=1e-5, abs=1e-7)
    assert ranking.recall == pytest.approx([e[1] for e in expected], rel=1e-5, abs=1e-7)
    assert all(isinstance(m, str) for m in source.config.to_dict().get("layer_types") or ["x"])


def test_ranking_leaves_no_layer_swapped():
    """After ranking, the source still has its own attention modules and config (the ranking swaps them into its
    one conversion and back)."""
    source = tiny_source("llama")
    before = [layer.self_attn for layer in source.model.layers]
    rank_layers(source, "gdn", IDS, batch_size=2, progress=False, sweep="keep-one", window=4, sinks=1)
    assert [layer.self_attn for layer in source.model.layers] == before
    assert type(before[0]).__name__ == "LlamaAttention"


@pytest.mark.parametrize("sweep", ["keep-one", "convert-one"])
@pytest.mark.parametrize("target, options", [("gdn", {"window": 4, "sinks": 1}), ("gsa", {"num_slots": 4})])
@pytest.mark.parametrize("group_tokens", [2 * 2 * 20, 10**6])
def test_candidates_side_by_side_rank_as_one_at_a_time(target, options, sweep, group_tokens, monkeypatch):
    """On a GPU the ranking runs its candidates side by side, several to one packed forward (each layer mixing the
    source's attention and the converted mixer block by block, `t2r.convert.candidates`); the scores are those
    of the candidates run one at a time on the rows apart, and so is the choice: 2 candidates a forward or all."""
    from t2r.convert import candidates

    monkeypatch.setattr(candidates, "GROUP_TOKENS", group_tokens)
    source = tiny_source("llama")
    ranked = {packed: rank_layers(source, target, IDS, batch_size=2, progress=False, recall=RECALL,
                                  criterion="kl+recall", sweep=sweep, packed=packed, **options)
              for packed in (False, True)}
    apart, packed = ranked[False], ranked[True]
    assert min(map(abs, apart.kl)) > 1e-5  # every candidate differs from the base model
    torch.testing.assert_close(torch.tensor(packed.kl), torch.tensor(apart.kl), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.tensor(packed.recall), torch.tensor(apart.recall), rtol=1e-4, atol=1e-6)
    assert packed.most_sensitive(1) == apart.most_sensitive(1)


def test_a_mixed_layer_gives_each_block_its_own_candidates_output():
    """`MixedAttention`: the source attention's output in the blocks whose candidate keeps the layer, the
    converted mixer's in the others."""
    from t2r.convert.candidates import MixedAttention

    class Constant(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.value = value

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            return torch.full_like(hidden_states, self.value), None

    mixed = MixedAttention(Constant(1.0), Constant(2.0), [False, True, False], block=3)
    out, _ = mixed(torch.zeros(1, 9, 4))
    assert out[0, :, 0].tolist() == [2.0] * 3 + [1.0] * 3 + [2.0] * 3
