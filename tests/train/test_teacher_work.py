"""What the teacher's forward computes for each loss: the fused KL reads the final hidden states, so neither
output head multiplies them by the vocabulary; attention MSE alone reads the paired layers' hooks, so the teacher
stops after the last of them. Counted in FLOPs (torch's FlopCounterMode), and the losses stay what they were."""

import torch
from torch.utils.flop_counter import FlopCounterMode

import t2r
from t2r.train.losses import hidden_states_as_logits
from t2r.train.transfer import AttentionTargets
from tests.helpers.models import tiny_source


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def ids(length=24, batch=2, seed=0):
    return torch.randint(3, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_hidden_states_as_logits_skip_the_heads_product_and_the_head_comes_back():
    model, x = tiny_source("llama"), ids()
    head = model.get_output_embeddings()
    with torch.no_grad():
        logits = model(input_ids=x).logits
        whole = flops(lambda: model(input_ids=x))
        with hidden_states_as_logits(model) as handed:
            hidden = model(input_ids=x).logits
            cut = flops(lambda: model(input_ids=x))
        again = model(input_ids=x).logits
    assert handed is head
    assert whole - cut == 2 * x.numel() * head.in_features * head.out_features
    assert torch.equal(hidden, model.model(input_ids=x).last_hidden_state)  # what the head reads
    assert torch.equal(again, logits) and "forward" not in vars(head)  # the head is whole again
    assert torch.allclose(hidden @ head.weight.T, logits, atol=1e-5)


def test_fill_stops_the_teacher_after_its_last_paired_layer_with_the_same_mse():
    teacher = tiny_source("llama")  # 3 layers
    student = t2r.convert(tiny_source("llama"), "gla", layers="0,1")
    targets = AttentionTargets(student, teacher)
    ran = []
    late = [teacher.model.layers[2].register_forward_hook(lambda *a: ran.append(2)),
            teacher.model.layers[1].mlp.register_forward_hook(lambda *a: ran.append("mlp 1"))]
    x = {"input_ids": ids(), "attention_mask": torch.ones(2, 24, dtype=torch.long)}
    with torch.no_grad():
        teacher(**x)  # the whole forward, as before
        assert sorted(targets.captured) == [0, 1] and ran == ["mlp 1", 2]
        whole = targets.mse()
        ran.clear()
        with hidden_states_as_logits(teacher):
            targets.fill(teacher, x)
        assert sorted(targets.captured) == [0, 1] and ran == []  # nothing after layer 1's attention ran
        cut = targets.mse()
        full_flops = flops(lambda: teacher(**x))
        targets.captured.clear()
        fill_flops = flops(lambda: targets.fill(teacher, x))
        assert targets._stop_after is None  # a plain forward after fill captures and runs whole again
        ran.clear()
        teacher(**x)
        assert ran == ["mlp 1", 2]
    assert torch.equal(cut, whole)
    assert fill_flops < 0.75 * full_flops, (fill_flops, full_flops)
    for handle in late:
        handle.remove()
    targets.close()


def test_fill_runs_the_whole_forward_through_the_student_under_fsdp():
    """`through_forward` (FSDP): the forward is not cut short, sharded units would stay gathered."""
    teacher = tiny_source("llama")
    targets = AttentionTargets(t2r.convert(tiny_source("llama"), "gla", layers="0"), teacher, through_forward=True)
    ran = []
    teacher.model.layers[2].register_forward_hook(lambda *a: ran.append(2))
    with torch.no_grad():
        targets.fill(teacher, {"input_ids": ids()})
    assert ran == [2] and sorted(targets.captured) == [0]
    targets.close()


def test_fill_compiles_nothing_where_the_teachers_layers_are_compiled():
    """The attention-MSE stage's teacher forward runs eager: its hooks would break each compiled layer's graph in
    two, graphs the later stages never use, and a run resumed after that stage compiled the whole graph the
    stopped run never made (a miss in Inductor's cache at the resumed first step). The captures are the same."""
    from torch._dynamo.utils import counters

    from t2r.models.compilation import compile_layers

    teacher = tiny_source("llama")
    student = t2r.convert(tiny_source("llama"), "gla", layers="0,1")
    x = {"input_ids": ids(), "use_cache": False}
    eager = AttentionTargets(student, teacher)
    with torch.no_grad():
        eager.fill(teacher, x)
    expected = {i: out.clone() for i, (_, out) in eager.captured.items()}
    eager.close()
    torch._dynamo.reset()
    compile_layers(teacher)
    targets = AttentionTargets(student, teacher)
    before = counters["stats"]["unique_graphs"]  # process-wide: other tests in this worker compiled before
    with torch.no_grad():
        targets.fill(teacher, x)
        targets.fill(teacher, x)
    assert counters["stats"]["unique_graphs"] == before
    assert sorted(targets.captured) == sorted(expected) == [0, 1]
    for i, out in expected.items():
        torch.testing.assert_close(targets.captured[i][1], out)
    targets.close()
    torch._dynamo.reset()
