"""The ``goodput`` command line, run as a real subprocess."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_util import goodput
from otlp_fixtures import Timeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The worked example of docs/accounting.md, plus an async save and a torn line."""
    d = tmp_path_factory.mktemp("run")
    a0 = Timeline(attempt=0, unit=60).job_start(0).restore(0, 5, step=25)
    a0.steps(26, 50, start=5, step_time=2).save(55, 60, step=50)
    a0.steps(51, 70, start=60, step_time=2)
    path = a0.write(d)
    with open(path, "a") as f:
        f.write('{"resourceSpans":[{"resou')  # killed mid-write
    a1 = Timeline(attempt=1, unit=60).job_start(115).restore(115, 120, step=50)
    a1.steps(51, 75, start=120, step_time=3).save(195, 200, step=75).job_end(200)
    a1.save(130, 133, step=55, blocking=False)
    a1.write(d)
    return d


def test_report_json(run_dir):
    p = goodput("report", run_dir, "--format", "json", "--ideal-step-time", "120")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["schema"] == "goodput.report/1"
    (job,) = report["jobs"]
    assert job["job"] == "job" and job["total_time_s"] == 12000
    assert job["productive_time_s"] == 6000 and job["goodput"] == 0.5
    assert job["badput_s"] == {
        "process_startup": 0, "accelerator_init": 0, "training_prep": 0,
        "program_startup": 0, "data_loading": 0,
        "checkpoint_save": 600, "checkpoint_restore": 600, "wasted_progress": 2400,
        "infrastructure_recovery": 900, "training_slowdown": 1500, "other": 0,
    }
    assert job["disruptions"] == 1 and job["max_productive_step"] == 75
    assert job["ideal_step_time_s"] == 120 and job["ideal_step_time_source"] == "given"
    assert job["step_time"]["count"] == 50 and job["step_time"]["anomalous_steps"] == 25
    assert job["step_time"]["max_s"] == 180
    assert [a["end_reason"] for a in job["attempts"]] == ["killed", "exit"]
    assert job["attempts"][1]["start_s"] == 6900 and job["attempts"][0]["steps_wasted"] == 20
    assert job["async_work_s"] == {"checkpoint_save": 180}
    assert job["skipped"] == {
        "torn": 1, "malformed": 0, "invalid_span": 0, "duplicate": 0, "unknown": 0,
        "unsupported_schema": 0, "over_limit": 0,
    }
    assert job["recorder"] == {"errors": 0, "dropped": 0}


def test_report_table(run_dir):
    p = goodput("report", run_dir, "--ideal-step-time", "120")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "Job job" in out and "goodput 50.00 %" in out and "3h 20m 00s" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["productive"][1:] == ["6000.000", "1h", "40m", "00s", "50.00"]
    assert lines["wasted_progress"][1:] == ["2400.000", "40m", "00s", "20.00"]
    assert lines["training_slowdown"][-1] == "12.50"
    order = [w for w in lines if w in ("productive", "checkpoint_save", "other")]
    assert order == ["productive", "checkpoint_save", "other"]
    assert "max productive step: 75" in out and "120.000 s (given)" in out
    assert "killed" in out and "asynchronous work (not badput): checkpoint_save 3m 00s" in out
    assert "skipped records: torn 1" in out


def test_report_estimated_ideal_and_job_filter(run_dir):
    p = goodput("report", run_dir, "--format", "json", "--job", "job")
    assert p.returncode == 0, p.stderr
    job = json.loads(p.stdout)["jobs"][0]
    assert job["ideal_step_time_source"] == "estimated" and job["ideal_step_time_s"] == 150


def assert_one_line_error(p, *fragments):
    assert p.returncode == 2
    assert p.stdout == ""
    assert "Traceback" not in p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("goodput: error: "), p.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_dir(tmp_path):
    assert_one_line_error(goodput("report", tmp_path / "nope"), "does not exist")


def test_empty_dir(tmp_path):
    assert_one_line_error(goodput("report", tmp_path), "no *.jsonl")


def test_file_instead_of_dir(tmp_path):
    f = tmp_path / "spans.jsonl"
    f.write_text("")
    assert_one_line_error(goodput("report", f), "not a directory")


def test_non_otlp_file(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"event_type": "job_started"}\n')
    assert_one_line_error(goodput("report", tmp_path), "events.jsonl:1:", "resourceSpans")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_bad_ideal_step_time(run_dir, value):
    assert_one_line_error(goodput("report", run_dir, "--ideal-step-time", value),
                          "--ideal-step-time")


def test_unknown_job_and_usage_errors(run_dir):
    assert_one_line_error(goodput("report", run_dir, "--job", "other"), "no job named", "job")
    assert_one_line_error(goodput("report", run_dir, "--format", "xml"), "invalid choice")
    assert_one_line_error(goodput(), "command is required")


def test_version():
    p = goodput("--version")
    assert p.returncode == 0 and p.stdout.startswith("goodput ")


def test_main_in_process(run_dir, capsys):
    from goodput_processor.cli import main

    assert main(["report", str(run_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["disruptions"] == 1
    assert main(["report", str(run_dir / "missing")]) == 2
    assert capsys.readouterr().err.startswith("goodput: error: ")


# --- help texts and hints name what an installed user can reach ---------------------------

URL = re.compile(r"https?://\S+?(?=[\s)',;]|\.(?:\s|$)|$)")
BARE_DOCS = re.compile(r"(?<![\w/.-])docs/")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def check_doc_urls(text: str) -> list[str]:
    """Every URL into the documentation in ``text`` names a page under docs/ and, with an
    anchor, one of that page's headings; returns the URLs."""
    from goodput.links import DOCS_URL

    urls = [u for u in URL.findall(text) if u.startswith(DOCS_URL)]
    for u in urls:
        page, _, anchor = u[len(DOCS_URL) + 1:].partition("#")
        path = ROOT / "docs" / page
        assert path.is_file() or (path.is_dir() and not anchor), f"{u}: no docs/{page}"
        if anchor:
            headings = [line.lstrip("#") for line in path.read_text().splitlines()
                        if line.startswith("#")]
            assert anchor in {github_anchor(h) for h in headings}, f"{u}: no such heading"
    return urls


def test_docs_url_is_pyprojects():
    tomllib = pytest.importorskip("tomllib")
    from goodput.links import DOCS_URL, REPO_URL, install_hint

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert DOCS_URL == urls["Documentation"] and REPO_URL == urls["Homepage"]
    assert install_hint("serve") == (
        f"pip install 'goodput-otel[serve]@git+{REPO_URL}' (or, in a clone of it: "
        "pip install '.[serve]')")


@pytest.mark.parametrize("command", [(), ("report",), ("serve",), ("import",)])
def test_help_names_urls_not_repository_paths(command):
    p = goodput(*command, "--help")
    assert p.returncode == 0, p.stderr
    assert not BARE_DOCS.search(p.stdout), p.stdout
    assert "pip install 'goodput-otel[" not in p.stdout.replace("]@git+", "")
    urls = check_doc_urls(p.stdout)  # whole (the help wraps at spaces only) and real
    assert urls, p.stdout


def test_serve_without_its_extra_says_how_to_install():
    """grpc blocked from import, as on an install without the serve extra."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"),
                                                       str(ROOT / "collectors")]))
    code = ("import sys; sys.modules['grpc'] = None; from goodput_processor.cli import main; "
            "sys.exit(main(['serve', '--spool-dir', '.']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    assert_one_line_error(p, "needs the serve extra",
                          "pip install 'goodput-otel[serve]@git+https://github.com/",
                          "pip install '.[serve]'")


def string_constants(path: Path):
    """(line, text) of the string literals of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docs):
            yield node.lineno, node.value


def test_no_message_names_a_repository_path_or_a_registry_install():
    """Help texts, errors, warnings and report footers (every string literal but
    docstrings) give URLs, and install lines from goodput.links."""
    bad = []
    for root in ("src/goodput", "collectors/goodput_processor", "instrumentation"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for line, text in string_constants(path):
                where = f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
                if BARE_DOCS.search(text):
                    bad.append(where)
                if "pip install 'goodput-otel" in text and path.name != "links.py":
                    bad.append(where)
    assert bad == []


def test_report_footers_link_the_definitions(run_dir):
    for name in ("mgm", "ettr"):
        p = goodput("report", run_dir, "--definitions", name)
        assert p.returncode == 0, p.stderr
        assert not BARE_DOCS.search(p.stdout)
        assert check_doc_urls(p.stdout), p.stdout


def test_docs_install_lines_work_before_publication():
    """README.md and docs/: every pip install of the package names the Git repository or a
    clone, except the README's one sentence on the line to use once it is published."""
    registry = re.compile(r"pip install '?goodput-otel(?:\[[^\]]*\])?(?![\[\w-])(?!\s*@)")
    bad = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if registry.search(line) and not line.startswith("Once it is published"):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line}")
    assert bad == []
