"""`t2r` itself: expected failures become messages and exit codes, a missing local path is named before
anything loads, `--help` and `--version` answer without heavy imports."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from t2r.cli import main
from tests.helpers.models import save_tiny_source


def test_bad_input_exits_with_a_clear_message(tmp_path, capsys):
    save_tiny_source(tmp_path / "src", tokenizer="words")
    code = main(["convert", "--model", str(tmp_path / "src"), "--to", "gsa", "--num-slots", "0",
                 "--out", str(tmp_path / "o"), "--device", "cpu"])
    assert code == 2
    assert "num_slots must be a positive integer" in capsys.readouterr().err
    code = main(["convert", "--model", str(tmp_path / "missing.gguf"), "--to", "gla", "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"error: not found: {tmp_path / 'missing.gguf'} (no such file or directory;" in capsys.readouterr().err
    code = main(["generate", "--model", str(tmp_path / "nowhere"), "--prompt", "w5", "--device", "cpu"])
    assert code == 2
    assert f"error: not found: {tmp_path / 'nowhere'} (no such file or directory;" in capsys.readouterr().err


T2R = shutil.which("t2r", path=os.path.dirname(sys.executable)) or shutil.which("t2r")


def t2r_command(args, cwd):
    """(completed process, seconds) of the installed `t2r` script, offline."""
    if T2R is None:
        pytest.skip("the t2r console script is not installed")
    start = time.perf_counter()
    done = subprocess.run([T2R, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done, time.perf_counter() - start


@pytest.mark.parametrize("args, path", [
    (["convert", "--model", "models/nope", "--to", "gsa", "--out", "out"], "models/nope"),
    (["convert", "--model", "runs/nope/final", "--to", "gla", "--out", "out"], "runs/nope/final"),
    (["eval", "--model", "runs/nope/final", "--out", "e"], "runs/nope/final"),
    (["eval", "--model", "smollm2", "--baseline", "./nope", "--out", "e"], "./nope"),
    (["generate", "--model", "runs/nope/final", "--prompt", "hi"], "runs/nope/final"),
    (["bench", "--model", "nope.gguf"], "nope.gguf"),
])
def test_a_missing_local_path_is_named_at_once(tmp_path, args, path):
    """A path that looks local and is missing: "not found", naming it, before any hub call or model load
    (models/nope has the form owner/name, but models/ is a local directory here)."""
    (tmp_path / "models").mkdir()
    done, seconds = t2r_command(args, tmp_path)
    # ~1-3 s idle (a torch import); a busy machine gets twice the time (5.2 s seen beside a test run on 2 cores)
    assert done.returncode == 2 and seconds < 5 * (1 + (os.getloadavg()[0] > 2)), (done.stderr, seconds)
    assert done.stderr.strip() == (f"t2r {args[0]}: error: not found: {path} (no such file or directory in "
                                   f"{os.path.realpath(tmp_path)}; a hub id has the form owner/name)")


def test_help_and_version_import_nothing_heavy(tmp_path):
    """`t2r --help`, `t2r <command> --help` and `--version` build the parser without torch or transformers;
    the t2r names still load on first use in that process."""
    script = ("import sys; sys.argv = ['t2r']; from t2r.cli import build_parser\n"
              "parser = build_parser(); parser.format_help()\n"
              "for command in parser._subparsers._group_actions[0].choices.values(): command.format_help()\n"
              "heavy = ('torch', 'transformers', 't2r.layers.base', 't2r.models')\n"
              "print(sorted(m for m in heavy if m in sys.modules))\n"
              "import t2r; print(callable(t2r.convert), list(t2r.MIXERS))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.splitlines() == ["[]", "True ['gsa', 'gla', 'retnet', 'fox', 'gdn']"], done.stderr
    for module in ("t2r", "t2r.cli"):  # python -m t2r is as light as the script
        script = ("import runpy, sys; sys.orig_argv = [sys.executable, '-m', %r, 'eval', '--help']; "
                  "sys.argv = ['-m', 'eval', '--help']\ntry:\n    runpy.run_module(%r, run_name='__main__')\n"
                  "except SystemExit:\n    pass\nprint('torch' in sys.modules)") % (module, module)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.stdout.splitlines()[-1] == "False" and "cost for SmolLM2-135M" in done.stdout, done.stderr
    done, _ = t2r_command(["--version"], tmp_path)
    from importlib.metadata import version

    assert (done.returncode, done.stdout) == (0, f"t2r {version('t2r')}\n")


@pytest.mark.parametrize("args, says", [
    (["finetune", "--config", "RECIPE", "train.lr=-1"], "train.lr: must be > 0, got -1.0"),
    (["run", "--config", "RECIPE", "train.bogus=1"], "train.bogus: unknown field"),
    (["finetune", "--config", "missing.yaml"], "recipe file 'missing.yaml' does not exist"),
    (["finetune", "--config", "RECIPE", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_recipe_flag_or_file_is_answered_without_torch(tmp_path, args, says):
    """The recipe is read and checked before any library loads: no torch, transformers or accelerate import in
    the process (`python -X importtime` lists every import), and the answer comes in well under 2 s."""
    recipe = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "smollm2-gsa-cpu.yaml")
    args = [os.path.realpath(recipe) if a == "RECIPE" else a for a in args]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "t2r.cli", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert not imported & {"torch", "transformers", "accelerate", "datasets"}, sorted(imported)[:50]
    assert seconds < 2 * (1 + 2 * (os.getloadavg()[0] > 2)), seconds  # 0.3 s on 2 idle cores


def test_the_command_leaves_its_process_group(tmp_path):
    """A process group the command ran in is destroyed before it exits (NCCL warns of leaked resources
    otherwise, after every `accelerate launch` run); without one, nothing happens."""
    import torch.distributed as dist

    from t2r.cli.app import leave_process_group

    leave_process_group()  # none formed: nothing to do
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    assert dist.is_initialized()
    leave_process_group()
    assert not dist.is_initialized()
