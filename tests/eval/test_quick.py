"""The quick look: `limit` shrinks every suite it touches and names each cut."""

from t2r.eval.quick import QUICK_LENGTH, shrink
from t2r.eval.settings import EvalSettings


def test_without_a_limit_nothing_is_cut():
    settings = EvalSettings()
    assert shrink(settings) == (settings, [])


def test_a_limit_shrinks_every_default_suite_and_says_so():
    quick, cuts = shrink(EvalSettings(limit=8, suites=["ppl", "mqar", "passkey", "bench"]))
    assert (quick.ppl_rows, quick.ppl_length, quick.mqar_prompts, quick.passkey_prompts) == (8, QUICK_LENGTH, 8, 2)
    assert quick.windows == [256]  # the largest window that fits 512 tokens (the mem window is added)
    assert quick.mqar_pairs == [8, 32] and quick.passkey_lengths == [512] and quick.passkey_depths == [0.0]
    assert quick.bench_contexts == [512, 1024] and quick.bench_repeats == 1
    assert "passkey_lengths 512,1024,2048,4096 -> 512" in cuts and "ppl_rows 16 -> 8" in cuts
    assert "passkey_depths 0,0.25,0.5,0.75,1 -> 0" in cuts  # the needle farthest back: what a window loses
    assert shrink(EvalSettings(limit=8, passkey_depths=[1.0, 0.5]))[0].passkey_depths == [0.5]
    assert not any(c.startswith(("mqar_prompts", "passkey_prompts", "lm_eval")) for c in cuts)  # unchanged: unsaid


def test_suites_not_run_are_not_cut_and_small_settings_stay():
    quick, cuts = shrink(EvalSettings(limit=2, suites=["ppl"], ppl_length=256, windows=[64], ppl_rows=4))
    assert cuts == ["ppl_rows 4 -> 2"]
    assert quick.passkey_lengths == EvalSettings().passkey_lengths


def test_the_limit_caps_lm_eval_documents_only_when_tasks_run():
    assert shrink(EvalSettings(limit=5, suites=[], tasks=["hellaswag"], lm_eval_limit=500))[0].lm_eval_limit == 5
    assert shrink(EvalSettings(limit=5, suites=["ppl"], lm_eval_limit=500))[0].lm_eval_limit == 500
