"""`finetune_and_evaluate`, the library call `t2r run` makes: from Python it writes what the command writes."""

import json

from t2r.cli import main
from t2r.train import finetune_and_evaluate
from tests.helpers.recipes import recipe

EVAL = {"eval.suites": "[ppl]", "eval.data": "held-out", "eval.ppl_length": 32, "eval.ppl_rows": 2,
        "eval.windows": "[8]"}


def files(directory) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_python_and_the_command_line_write_the_same_run(tmp_path, source_dir, corpus, capsys):
    python = recipe(tmp_path, source_dir, corpus, run="python", **EVAL)
    done = finetune_and_evaluate(python)
    assert done.model_dir == tmp_path / "python" / "final" and done.report == tmp_path / "python" / "eval" / "report.md"
    assert done.metrics["step"] == 6 and done.results["perplexity"]["rows"] == 2
    capsys.readouterr()

    recipe(tmp_path, source_dir, corpus, run="cli")  # writes cli.yaml
    assert main(["run", "--config", str(tmp_path / "cli.yaml"), *(f"{k}={v}" for k, v in EVAL.items())]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"model saved to {tmp_path / 'cli' / 'final'}; report written to "
                        f"{tmp_path / 'cli' / 'eval' / 'report.md'}\n")

    assert files(tmp_path / "python") == files(tmp_path / "cli")
    ppl = {name: json.loads((tmp_path / name / "eval" / "results.json").read_text())["perplexity"]["results"]
           for name in ("python", "cli")}
    assert [(r["name"], r["ppl"]) for r in ppl["python"]] == [(r["name"], r["ppl"]) for r in ppl["cli"]]
    losses = {name: [json.loads(line).get("loss") for line in (tmp_path / name / "metrics.jsonl").open()]
              for name in ("python", "cli")}
    assert losses["python"] == losses["cli"]
    for name in ("python", "cli"):  # the card carries the evaluation either way
        assert "## Evaluation" in (tmp_path / name / "final" / "README.md").read_text()
