"""What a run writes and says besides its model: files as the user's umask says, the held-out loss in
`metrics.jsonl`, only `final/` with `checkpoint.keep_last: 0` (a crash still resumes from the newest
checkpoint), one plain line per logging step when stderr is not a terminal, no progress bars or
tied-weights notes from the libraries, and one clear line when `loss.png` cannot be drawn."""

import io
import json
import logging
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers.utils import logging as hf_logging

from t2r.outputs import follow_umask, quiet_libraries
from t2r.train import Interrupt, RunDirError, finetune, logs
from t2r.train import checkpoint as ckpt
from tests.helpers.data import char_tokenizer
from tests.helpers.models import tiny_source
from tests.helpers.recipes import recipe

UMASK = 0o027


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(scope="module")
def lean(tmp_path_factory, corpus):
    """The tiny recipe on a model with tied embeddings, `keep_last: 0`, `plot: true` without matplotlib,
    umask 027, stdout and stderr captured (stderr no terminal): stopped after step 4, then resumed."""
    tmp = tmp_path_factory.mktemp("lean")
    tokenizer = char_tokenizer()
    tiny_source("llama", vocab_size=len(tokenizer), tie_word_embeddings=True).save_pretrained(tmp / "source")
    tokenizer.save_pretrained(tmp / "source")
    r = recipe(tmp, tmp / "source", corpus, **{"checkpoint.keep_last": 0, "logging.plot": True})
    root = Path(r.checkpoint.dir)
    modes = {}

    def stop_after_step_4(metrics):
        if metrics["step"] == 3:
            modes.update({p.name: p.stat().st_mode & 0o777 for p in ckpt.latest(root).iterdir()})
        if metrics["step"] == 4:
            raise Interrupt

    saves = logging.getLogger("accelerate.utils.other")  # where accelerate notes the tied weights it skipped
    notes = logging.Handler()
    notes.records = []
    notes.emit = notes.records.append
    out, err = io.StringIO(), io.StringIO()
    mask = os.umask(UMASK)
    saves.addHandler(notes)
    try:
        with pytest.MonkeyPatch.context() as mp, redirect_stdout(out):
            mp.setattr(sys, "stderr", err)
            mp.setitem(sys.modules, "matplotlib", None)  # as if not installed
            with pytest.raises(Interrupt):
                finetune(r, callbacks=[stop_after_step_4])
            kept = [p.name for p in ckpt.checkpoints(root)]
            final = finetune(r, resume=True)
    finally:
        os.umask(mask)
        saves.removeHandler(notes)
    return SimpleNamespace(recipe=r, root=root, final=final, kept=kept, modes=modes, out=out.getvalue(),
                           err=err.getvalue(), notes=[n.getMessage() for n in notes.records])


def test_keep_last_0_keeps_only_final_and_a_crash_still_resumes(lean):
    assert lean.kept == ["step-00000003"]  # the newest checkpoint is kept while training: the crash resumed from it
    assert "resumed from" in lean.out and "(step 3, " in lean.out and lean.final["step"] == 6
    assert ckpt.checkpoints(lean.root) == [] and (lean.root / "final" / "model.safetensors").is_file()
    assert f"checkpoint.keep_last=0: deleted step-00000006, {lean.root / 'final'} is written" in lean.out
    with pytest.raises(RunDirError, match="holds a finished run \\(final/\\) and no checkpoint to continue it from"):
        finetune(lean.recipe, resume=True)
    with pytest.raises(RunDirError, match=r"holds another run \(final/, metrics.jsonl, .*\): --overwrite deletes it"):
        finetune(lean.recipe)
    assert (lean.root / "final" / "model.safetensors").is_file()  # refused, nothing deleted


def test_files_follow_the_umask(lean, tmp_path):
    expected = 0o666 & ~UMASK
    assert "model.safetensors" in lean.modes and "rng-0.safetensors" in lean.modes
    assert lean.modes == {name: expected for name in lean.modes}, lean.modes
    final = {p.name: p.stat().st_mode & 0o777 for p in (lean.root / "final").iterdir()}
    assert "model.safetensors" in final and final == {name: expected for name in final}, final
    private = tmp_path / "a" / "b"
    private.parent.mkdir()
    private.write_text("x")
    os.chmod(private, 0o600)
    mask = os.umask(0o002)
    try:
        follow_umask(tmp_path)
    finally:
        os.umask(mask)
    assert private.stat().st_mode & 0o777 == 0o664


def test_the_held_out_loss_is_the_last_record_of_metrics_jsonl(lean):
    rows = [json.loads(line) for line in (lean.root / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    held_out = [r for r in rows if "held_out_loss" in r]
    assert held_out == [rows[-1]] and rows[-1]["step"] == 6 and rows[-1]["tokens"] == 6 * 128
    assert rows[-1]["held_out_loss"] == pytest.approx(lean.final["validation_loss"])
    assert rows[-1]["held_out_ppl"] == pytest.approx(lean.final["validation_ppl"])


def test_plain_lines_without_a_terminal_and_no_library_noise(lean):
    steps = [line.split()[1] for line in lean.out.splitlines() if line.startswith("step ")]
    assert steps == ["1/6", "2/6", "3/6", "4/6", "4/6", "5/6", "6/6"]  # stopped after 4; resumed from 3
    assert "loss " in lean.out and "tok/s" in lean.out
    assert "held-out loss " in lean.out and "after step 6, on data.held_out=" in lean.out  # quoted by the README
    for noise in ("Loading weights", "Writing model shards", "it/s]", "\r"):
        assert noise not in lean.err, noise
    assert not [n for n in lean.notes if "Removed shared tensor" in n], lean.notes


def test_a_missing_matplotlib_is_said_once(lean):
    assert lean.out.count("matplotlib is not installed") == 1
    assert f"so {lean.root / 'loss.png'} was not drawn (the losses are in metrics.jsonl); pip install matplotlib" \
        in lean.out
    assert not (lean.root / "loss.png").exists()


def test_the_tied_weights_note_is_dropped_only_for_declared_tied_weights():
    note = ckpt._TiedWeightsNote({"lm_head.weight"})

    def record(names):
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1,
                                 f"[RANK 0] Removed shared tensor {names} while saving. This should be OK, but check",
                                 None, None)

    assert not note.filter(record({"lm_head.weight"}))
    assert not note.filter(record({"base_model.model.lm_head.weight"}))  # peft's prefix
    assert note.filter(record({"lm_head.weight", "model.layers.0.mlp.up_proj.weight"}))
    assert note.filter(logging.LogRecord("x", logging.WARNING, __file__, 1, "another warning", None, None))


def test_progress_is_a_bar_on_a_terminal_and_one_line_per_logging_step_elsewhere(capsys):
    rows = [{"step": s, "tokens": 128 * s, "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 100.0}
            for s in range(1, 6)]
    rows[2] = {**rows[2], "loss": None, "grad_norm": None, "skipped": True}
    terminal = Terminal()
    for stream, enabled in ((terminal, True), (io.StringIO(), True), (io.StringIO(), False)):
        progress = logs.Progress(5, 0, enabled, every=2, stream=stream)
        for row in rows:
            progress.step(row)
        progress.close()
        if stream is terminal:
            assert "5/5" in terminal.getvalue() and "loss=2.000" in terminal.getvalue()
            assert capsys.readouterr().out == ""
        elif enabled:
            lines = capsys.readouterr().out.splitlines()
            assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"]  # and the last step
            assert lines[0].startswith("step 2/5  loss 2.000  lr 1.00e-03  grad_norm 0.5  100 tok/s  256 tokens  ")
        else:
            assert capsys.readouterr().out == ""  # other processes than the main one print nothing
    progress = logs.Progress(5, 2, True, every=1, stream=io.StringIO())
    progress.step(rows[2])
    assert capsys.readouterr().out.startswith("step 3/5  loss skipped  lr 1.00e-03  grad_norm nan")
    progress.step({**rows[3], "gpu_peak_gib": 29.43})  # on a GPU: the card's peak memory so far
    assert "512 tokens  peak 29.4 GiB  elapsed" in capsys.readouterr().out


def test_quiet_libraries_restores_the_progress_bars():
    assert hf_logging.is_progress_bar_enabled()
    with quiet_libraries():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_libraries():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # left as the caller set it
    finally:
        hf_logging.enable_progress_bar()


def test_plot_says_why_it_drew_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    said = logs.plot([{"step": 1, "tokens": 10, "loss": 1.0}], tmp_path / "loss.png", "t")
    assert said.startswith("logging.plot: matplotlib is not installed") and not (tmp_path / "loss.png").exists()


def test_startup_clock_counts_each_second_once():
    """Nested parts count their own time only; `other` is what no part held; the parts add up to the total."""
    import time

    from t2r.train.startup import StartupClock

    clock = StartupClock()
    with clock.part("convert"):
        time.sleep(0.2)
        with clock.part("calibration"):
            time.sleep(0.3)
    clock.done()
    clock.add("late", 1.0)  # after done(): ignored
    # counted twice, convert would hold 0.5 s; the slack is a loaded machine's (a sleep of 30 ms took 50)
    assert 0.3 <= clock.parts["calibration"] < 0.45 and 0.2 <= clock.parts["convert"] < 0.45
    assert "late" not in clock.parts and clock.parts["other"] >= 0
    assert abs(sum(clock.parts.values()) - clock.total) < 1e-9


def test_startup_clock_of_the_command_line_starts_with_the_process():
    """The command line's clock counts the process's time before it (interpreter start and imports: seconds the
    start-up line once left out) as `imports`; the parts still add up to the total."""
    import subprocess
    import sys
    import time

    from t2r.train.startup import StartupClock, process_age

    age = process_age()
    if age is None:
        pytest.skip("no /proc: the process's start time is not known here")
    clock = StartupClock(since_process_start=True)
    assert clock.parts["imports"] >= age > 0
    assert "imports" not in StartupClock().parts  # finetune() from a notebook: from the call on
    clock.done()
    assert clock.total >= clock.parts["imports"] and abs(sum(clock.parts.values()) - clock.total) < 1e-9
    # a new process's age is its own: a child that sleeps 0.3 s before asking reports at least that
    code = "import time; time.sleep(0.3); from t2r.train.startup import process_age; print(process_age())"
    start = time.perf_counter()
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.3 <= child <= time.perf_counter() - start + 0.02


def test_a_run_writes_its_startup_breakdown(tmp_path, source_dir, corpus, capsys):
    import json

    r = recipe(tmp_path, source_dir, corpus, run="startup", **{"train.max_steps": 2})
    finetune(r)
    record = json.loads((tmp_path / "startup" / "startup.json").read_text())
    for part in ("data check", "load", "convert", "prepare", "held-out loss", "first batches", "first step", "other"):
        assert record[f"{part}_s"] >= 0, part
    parts = sum(v for k, v in record.items() if k != "total_s")
    assert abs(parts - record["total_s"]) < 0.01 and record["first step_s"] > 0
    assert "start-up: " in capsys.readouterr().out
