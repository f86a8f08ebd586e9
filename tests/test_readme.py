"""The README's sample report is what the code writes: the main job's recorded report is `markdown` of its
recorded results, and the README quotes that report's summary and perplexity table line for line."""

import json
import re
from pathlib import Path

from t2r.eval.report import markdown

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "main_job_cpu"


def readme_sample() -> list[str]:
    """The lines of the README's fenced block after "The report it printed"."""
    text = (ROOT / "README.md").read_text()
    return re.search(r"```\n(.*?)\n```", text[text.index("The report it printed"):], re.S).group(1).splitlines()


def section(lines: list[str], start: int) -> list[str]:
    """`lines[start:]` up to the first empty line."""
    return lines[start:lines.index("", start)]


def test_the_recorded_report_is_what_the_code_writes_for_its_results():
    results = json.loads((RECORD / "results.json").read_text())
    assert (RECORD / "report.md").read_text() == markdown(results), \
        "benchmarks/results/main_job_cpu/report.md drifted from the code: run the main job and copy its eval/ there"


def test_the_readmes_sample_is_the_recorded_reports_summary_and_perplexity_table():
    report = (RECORD / "report.md").read_text().splitlines()
    summary = section(report, report.index("## Summary") + 1)
    heading = report.index("## Perplexity by position")
    table = section(report, next(i for i in range(heading, len(report)) if report[i].startswith("| model")))
    assert readme_sample() == [*summary, "", *table]
