"""``mindwatch check``: the CI gate's exit codes on real runs, the rule language, and that rules cannot run code."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mindwatch
from mindwatch.checks.evaluate import evaluate
from mindwatch.checks.language import RuleError, parse_rule
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

HEALTHY_RULES = [
    "max(grad_norm, last=100) < 1e5",
    "alerts(severity='error') == 0",
    "final(loss) < first(loss)",
    "nonfinite(loss) == 0",
    "state() == 'finished'",
]


def check(*args: str) -> subprocess.CompletedProcess:
    """The real command line, so the exit code is the one CI sees."""
    return subprocess.run(
        [sys.executable, "-m", "mindwatch.cli", "check", *args], capture_output=True, text=True, timeout=120, env=_wide_env()
    )


def _wide_env() -> dict[str, str]:
    import os

    return {**os.environ, "COLUMNS": "200"}


def rule_args(rules: list[str]) -> list[str]:
    return [x for r in rules for x in ("--rule", r)]


# -- real runs --------------------------------------------------------------------------------------
def test_healthy_run_passes(report_runs) -> None:
    proc = check(str(report_runs["finished"]), *rule_args(HEALTHY_RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" pass ") == len(HEALTHY_RULES) and "FAIL" not in proc.stdout
    assert f"all {len(HEALTHY_RULES)} rules passed" in proc.stdout


def test_unhealthy_runs_fail(report_runs) -> None:
    run_dir = report_runs["failed"]
    proc = check(str(run_dir), *rule_args(HEALTHY_RULES), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = {r["rule"]: r for r in json.loads(proc.stdout)["results"]}
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines()]
    n_nan = sum(v == "nan" for v in losses)
    assert n_nan > 0
    assert results["nonfinite(loss) == 0"] == {
        "rule": "nonfinite(loss) == 0",
        "passed": False,
        "values": {"nonfinite(loss)": n_nan},
    }
    assert not results["final(loss) < first(loss)"]["passed"]  # NaN compares false
    assert results["state() == 'finished'"]["values"] == {"state()": "failed"}
    assert results["max(grad_norm, last=100) < 1e5"]["values"]["max(grad_norm, last=100)"] == "nan"
    # the killed run never reached a final state
    killed = check(str(report_runs["killed"]), "--rule", "state() == 'finished'", "--rule", "steps() >= 8")
    assert killed.returncode == 1 and "FAIL" in killed.stdout and "pass" in killed.stdout


def test_rules_from_the_run_config_and_from_a_file(report_runs, tmp_path: Path) -> None:
    # the trainings put checks: [...] into their monitor_config; meta.json keeps it
    assert check(str(report_runs["finished"])).returncode == 0
    proc = check(str(report_runs["failed"]))
    assert proc.returncode == 1 and "nonfinite(loss) == 0" in proc.stdout
    yaml_file = tmp_path / "gate.yaml"
    yaml_file.write_text("monitor_config:\n  checks:\n    - final(loss) < first(loss)\n    - steps() >= 16\n")
    assert check(str(report_runs["finished"]), "--rules-file", str(yaml_file)).returncode == 0
    text_file = tmp_path / "gate.txt"
    text_file.write_text("# CI gate\nfinal(loss) < first(loss)\n\nsteps() >= 1000\n")
    proc = check(str(report_runs["finished"]), "--rules-file", str(text_file))
    assert proc.returncode == 1 and "steps() >= 1000" in proc.stdout


def test_no_rules_and_no_run_are_usage_errors(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path)
    proc = check(str(run_dir))
    assert proc.returncode == 2 and "no rules" in proc.stderr
    proc = check(str(tmp_path / "nope"), "--rule", "steps() > 0")
    assert proc.returncode == 2 and "no run directory" in proc.stderr


@pytest.mark.parametrize(
    "rule, column, words",
    [
        ("max(grad_norm, last=) < 1e5", 21, "expected a value"),
        ("final(loss) <", 14, "end of the rule"),
        ("final(loss) = 2", 13, "use '=='"),
        ("maxx(loss) < 1", 1, "unknown function 'maxx'"),
        ("max(loss, lats=5) < 1", 11, "no option 'lats'"),
        ("loss < 2", 1, "metrics go inside a function"),
        ("(final(loss) < 2", 17, "')' to close"),
        ("final(loss) < 2 2", 17, "unexpected '2'"),
        ("final(loss) < 'x", 15, "matching quotes"),
        ("final(loss)", 1, "must be true or false"),
        ("max(loss, last=-1) < 2", 16, "whole number"),
        ("percentile(loss) < 2", 1, "needs q"),
    ],
)
def test_malformed_rule_exits_2_with_the_position(rule: str, column: int, words: str, tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path)
    proc = check(str(run_dir), "--rule", "steps() > 0", "--rule", rule)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    i = lines.index(rule)
    assert lines[i + 1] == " " * (column - 1) + "^", proc.stderr
    assert words in lines[i + 2] and f"(column {column})" in lines[i + 2]
    assert proc.stdout == ""  # a bad rule stops the gate before any rule is evaluated


# -- nothing in a rule runs code ----------------------------------------------------------------------
EVIL = [
    "__import__('os').system('touch {marker}') == 0",
    "__import__('os') == 0",
    "open('{marker}', 'w') == 0",
    'exec(\'open("{marker}", "w")\') == 0',
    "eval('1') == 1",
    "final(loss).__class__ == 0",
    "final(loss).__class__.__bases__[0].__subclasses__() == 0",
    "(lambda: 1)() == 1",
    "[x for x in (1, 2)] == 0",
    "{{}} == 0",
    "final(loss)[0] == 0",
    "final(loss); import os",
    "globals() == 0",
    "final(loss) if 1 else 2",
    "'a' * 1000000000 == 'a'",
    "f'{{1}}' == '1'",
    "final(loss) < 1 # comment",
    "(" * 5000 + "1" + ")" * 5000 + " == 1",
    "-" * 5000 + "1 < 0",
    "not " * 5000 + "true",
    "final(loss) < 1 and " * 200 + "true",
]


@pytest.mark.parametrize("template", EVIL, ids=range(len(EVIL)))
def test_no_rule_can_execute_code(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run = mindwatch.open_run(synthetic_run(tmp_path))
    with pytest.raises(RuleError):
        evaluate(run, template.format(marker=marker))
    assert not marker.exists()


@pytest.mark.parametrize(
    "rule, passed",
    [
        ("10 ** 400 == inf", True),  # floats, never big integers (an integer 10 ** 400 is finite)
        ("10 ** 10 ** 10 ** 10 > 0", True),  # inf, at once
        ("(-8) ** 0.5 > 0", False),  # nan
        ("1 / 0 > 1e308", True),
        ("0 / 0 == 0 / 0", False),
        ("2 ** -10000 == 0", True),
        ("max(loss, rank=0) ** 1e308 > 0", True),
    ],
)
def test_huge_numbers_are_floats(rule: str, passed: bool, tmp_path: Path) -> None:
    run = mindwatch.open_run(synthetic_run(tmp_path))
    assert evaluate(run, rule).passed is passed


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("maxfinl(loss)_,=<>!+-*/%'\" 0123.e9andortq[]{}:;.\\\n")), max_size=60))
def test_any_text_parses_or_raises_rule_error(text: str) -> None:
    try:
        parse_rule(text)
    except RuleError as e:
        assert e.position is None or 0 <= e.position <= len(text)


# -- the language's meaning, on a synthetic two-rank run ----------------------------------------------
def synthetic_run(tmp_path: Path) -> Path:
    """Two ranks, 50 steps; rank 1 is slower and has one NaN loss; three alerts; meta with a start time."""
    run_dir = tmp_path / "synthetic"
    if run_dir.exists():
        return run_dir
    t0 = 1_800_000_000.0
    for rank in (0, 1):
        w = RunWriter(run_dir, rank=rank)
        recs = []
        for step in range(1, 51):
            rec = {"step": step, "epoch": 1, "t": t0 + step, "rank": rank, "loss": 5.0 - step * 0.05 + rank}
            rec["samples_per_second"] = 100.0 + step if rank == 0 else 50.0
            if rank == 1 and step == 30:
                rec["loss"] = math.nan
            if step % 10 == 0:
                rec["grad_norm"] = float(step)
            recs.append(rec)
        w.write(recs)
        if rank == 0:
            w.append_alert({"t": t0 + 5, "step": 5, "rank": 0, "rule": "spike", "metric": "loss", "severity": "warning"})
            w.append_alert({"t": t0 + 30, "step": 30, "rank": 1, "rule": "nonfinite", "metric": "loss", "severity": "error"})
            w.append_alert({"t": t0 + 40, "step": 40, "rank": 0, "rule": "stall", "metric": None, "severity": "info"})
        w.close("finished")
    write_json_atomic(run_dir / "meta.json", {"run_id": "synthetic", "started_at": t0, "ended_at": t0 + 60})
    return run_dir


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("final(loss)", 5.0 - 50 * 0.05),
        ("final(loss, rank=1)", 6.0 - 50 * 0.05),
        ("first(loss)", 4.95),
        ("count(loss)", 100),
        ("count(grad_norm, rank=0)", 5),
        ("nonfinite(loss)", 1),
        ("nonfinite(loss, rank=0)", 0),
        ("max(loss, rank=0)", 4.95),
        ("min(loss, rank=0, last=10)", 2.5),
        ("mean(samples_per_second, rank=0)", float(np.mean(100 + np.arange(1, 51)))),
        ("mean(samples_per_second, rank=0, last=5)", float(np.mean(100 + np.arange(46, 51)))),
        ("median(samples_per_second)", float(np.median(np.r_[100 + np.arange(1, 51), np.full(50, 50.0)]))),
        ("percentile(samples_per_second, 5, rank=0)", float(np.percentile(100 + np.arange(1, 51), 5))),
        ("percentile(samples_per_second, q=50, rank=1)", 50.0),
        ("sum(grad_norm, rank=1)", 150.0),
        ("std(grad_norm, rank=0)", float(np.std([10, 20, 30, 40, 50]))),
        ("max(grad_norm, last=2)", 50.0),
        ("alerts()", 3),
        ("alerts(severity='error')", 1),
        ("alerts(severity='warning', metric='loss')", 1),
        ("alerts(rank=0)", 2),
        ("alerts(rule='stall')", 1),
        ("steps()", 50),
        ("duration()", 60.0),
        ("abs(-2 * 3) + 10 % 4", 8.0),
        ("-final(loss) + 2 ** 3", 8 - 2.5),
    ],
)
def test_functions_mean_what_the_readme_says(expr: str, expected: float, tmp_path: Path) -> None:
    run = mindwatch.open_run(synthetic_run(tmp_path))
    result = evaluate(run, f"{expr} == {expected!r}")
    assert result.passed, result.values
    assert evaluate(run, f"{expr} != {expected!r}").passed is False


@pytest.mark.parametrize(
    "rule, passed",
    [
        ("max(loss) > 0", False),  # rank 1 has a NaN: max is NaN, comparisons are false
        ("max(loss, rank=0) < 5 and min(loss, rank=0) > 2", True),
        ("max(loss, rank=0) > 5 or steps() == 50", True),
        ("not (steps() < 50)", True),
        ("1 < final(loss) < 3", True),
        ("1 < final(loss) < 2", False),
        ("state() == 'finished' and state() != 'failed'", True),
        ("final(no_such_metric) < 1", False),  # no data: the rule fails, it is not a usage error
        ("final(no_such_metric) < 1 or true", True),
        ("final(no_such_metric) < 1 and false", False),
        ("count(no_such_metric) == 0", True),
        ("final('loss') == final(loss)", True),
    ],
)
def test_logic_nan_and_missing_data(rule: str, passed: bool, tmp_path: Path) -> None:
    run = mindwatch.open_run(synthetic_run(tmp_path))
    assert evaluate(run, rule).passed is passed


def test_missing_metric_is_shown_as_missing(tmp_path: Path) -> None:
    proc = check(str(synthetic_run(tmp_path)), "--rule", "final(val_loss) < 1")
    assert proc.returncode == 1
    assert "missing (no values of 'val_loss')" in proc.stdout


def test_config_rejects_a_bad_check_at_load_time() -> None:
    from mindwatch.config import ConfigError, load_config

    assert load_config({"checks": ["final(loss) < 2.5"]}).checks == ["final(loss) < 2.5"]
    with pytest.raises(ConfigError, match=r"monitor_config\.checks") as err:
        load_config({"checks": ["final(loss) < 2.5", "final(loss) <<"]})
    assert "^" in str(err.value)


def test_a_misspelt_metric_is_a_usage_error_that_names_the_right_one(tmp_path: Path) -> None:
    proc = check(str(synthetic_run(tmp_path)), "--rule", "final(los) < 2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did you mean loss" in proc.stderr


def test_an_option_without_quotes_says_the_value_needs_them(tmp_path: Path) -> None:
    proc = check(str(synthetic_run(tmp_path)), "--rule", "alerts(severity=error) == 0")
    assert proc.returncode == 2
    assert "severity='error'" in proc.stderr and "quotes" in proc.stderr


# -- evaluations ---------------------------------------------------------------------------------------
def test_metric_names_with_a_slash_parse_inside_every_function() -> None:
    rule = parse_rule("best(eval/loss) < 0.5 and final(eval/accuracy) >= 0.9 and count(eval/top_1.k) > 0")
    assert rule.functions == ("best", "final", "count")
    calls = [rule.tree.left.left.first, rule.tree.left.right.first, rule.tree.right.first]  # type: ignore[attr-defined]
    assert [c.metric for c in calls] == ["eval/loss", "eval/accuracy", "eval/top_1.k"]
    assert parse_rule("best('eval/top-1') > 0.5").tree.first.metric == "eval/top-1"  # type: ignore[attr-defined]
    with pytest.raises(RuleError, match=r"best\(\) has no option 'last'; options: rank="):
        parse_rule("best(eval/loss, last=3) < 1")


def test_best_and_final_of_a_loops_evaluations(tmp_path: Path) -> None:
    """A loop evaluates three times; ``check`` judges the values it handed to ``run.eval``: ``best()`` by each
    metric's mode (a loss the smallest, an accuracy the largest, the primary by ``evaluation.mode``), ``final()`` the
    last evaluation's."""
    from evaluated_loop import EvaluatedLoop

    evaluated = [
        {"loss": 0.7, "accuracy": 0.80, "score": 3.0},
        {"loss": 0.45, "accuracy": 0.93, "score": 1.0},
        {"loss": 0.52, "accuracy": 0.91, "score": 2.0},
    ]
    # the primary is eval/score, which reads as "higher is better": the config says lower is
    config = {"interval": 60, "evaluation": {"primary": "score", "mode": "min"}}
    with EvaluatedLoop(tmp_path, **config) as loop:
        for epoch, results in enumerate(evaluated, start=1):
            loop.train(3)
            loop.eval(**results, eval_time=0.1, epoch=epoch)
    run = mindwatch.open_run(loop.run_dir)
    expected = {
        "best(eval/loss)": min(e["loss"] for e in evaluated),
        "best(eval/accuracy)": max(e["accuracy"] for e in evaluated),
        "best(eval/score)": min(e["score"] for e in evaluated),
        "final(eval/accuracy)": evaluated[-1]["accuracy"],
        "first(eval/loss)": evaluated[0]["loss"],
        "count(eval/loss)": len(evaluated),
        "best(loss)": min(loop.losses.values()),
    }
    for call, value in expected.items():
        result = evaluate(run, f"{call} == {value!r}")
        assert result.passed and result.values == {call: pytest.approx(value)}, result.values
    assert [e["step"] for e in loop.evaluations] == [3, 6, 9] and run.series("eval/accuracy").step.tolist() == [3, 6, 9]

    proc = check(str(loop.run_dir), "--rule", "best(eval/loss) < 0.5", "--rule", "final(eval/accuracy) >= 0.9", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["rule"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["best(eval/loss) < 0.5"]["values"] == {"best(eval/loss)": 0.45}
    assert results["final(eval/accuracy) >= 0.9"]["values"] == {"final(eval/accuracy)": 0.91}
    failing = check(str(loop.run_dir), "--rule", "best(eval/loss) < 0.4", "--rule", "best(eval/nothing) < 1")
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "missing (no values of 'eval/nothing')" in failing.stdout


def test_best_is_one_ranks_and_leaves_out_what_is_not_finite(tmp_path: Path) -> None:
    run = mindwatch.open_run(synthetic_run(tmp_path))  # rank 1 has a NaN loss
    bests = {}
    for rank in (0, 1):
        values = run.series("loss", rank=rank).value
        bests[rank] = float(values[np.isfinite(values)].min())
        assert evaluate(run, f"best(loss, rank={rank}) == {bests[rank]!r}").passed
    assert not np.isfinite(run.series("loss", rank=1).value).all()
    assert evaluate(run, f"best(loss) == {bests[0]!r}").passed  # the lowest rank's, as final() and first()
