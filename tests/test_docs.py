"""The docs and the code agree: every CLI option and every config key is documented, and nothing that is gone."""

from __future__ import annotations

import argparse
import re
import typing

import pytest
from conftest import REPO
from pydantic import BaseModel

from mindwatch.cli import build_parser
from mindwatch.config import MonitorConfig
from mindwatch.schema import RuleSettings

DOCS = REPO / "docs"


def sub_commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def documented_options(command: str) -> set[str]:
    """The options in the first column of the tables under ``## `mindwatch COMMAND` `` in docs/cli.md."""
    text = (DOCS / "cli.md").read_text()
    if command:
        text = text.split(f"## `mindwatch {command}`\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    first_cells = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `-")]
    return {m for cell in first_cells for m in re.findall(r"`(-{1,2}[a-z][\w-]*)", cell)}


@pytest.mark.parametrize("command", list(sub_commands()))
def test_every_option_of_each_command_is_in_docs_cli_md_and_no_other(command: str) -> None:
    help_flags = set() if command == "" else {"-h", "--help"}  # documented once, at the top
    assert documented_options(command) == options(sub_commands()[command]) - help_flags


def config_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, bool]]:
    """Every leaf key of the config as a dotted path; True where it is a rule's ``enabled``/``actions``."""
    keys = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = field.annotation
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        if typing.get_origin(inner) is typing.Annotated:
            inner = typing.get_args(inner)[0]
        members = typing.get_args(inner) if typing.get_origin(inner) is typing.Union else (inner,)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += config_keys(ann, path + ".")
        elif all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
            keys += list(dict.fromkeys(k for m in members for k in config_keys(m, path + "[].")))  # one row per key
        else:
            keys.append((path, issubclass(model, RuleSettings) and name in RuleSettings.model_fields))
    return keys


def test_every_config_key_is_in_docs_configuration_md() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = []
    for path, rule_common in config_keys(MonitorConfig):
        if rule_common:  # alerts.spike.enabled is documented once, as alerts.<rule>.enabled
            path = re.sub(r"\.[a-z_]+\.(enabled|actions)$", r".<rule>.\1", path)
        if f"`{path}`" not in text:
            missing.append(path)
    assert missing == []


def test_docs_configuration_md_names_no_key_that_does_not_exist() -> None:
    known = {path for path, _ in config_keys(MonitorConfig)}
    known |= {re.sub(r"\.[a-z_]+\.(enabled|actions)$", r".<rule>.\1", p) for p in known}
    text = (DOCS / "configuration.md").read_text()
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `")]
    documented = {k for row in rows for k in re.findall(r"`([a-z_.\[\]<>]+)`", row)}
    assert documented - known == set()


def test_the_docs_link_only_to_files_and_headings_that_exist() -> None:
    pages = [REPO / "README.md", *DOCS.glob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file) if file else page
            if dest.name == "architecture.md":
                continue  # written in another change
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)} if anchor and dest.is_file() else set()
            if not dest.exists() or (anchor and anchor not in headings):
                broken.append(f"{page.name}: {target}")
    assert broken == []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_keeps_the_two_commands_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make demo   #" in readme and "make test   #" in readme
    for install in (
        "pip install dist/mindwatch-<version>-py3-none-any.whl",
        'pip install "dist/mindwatch-<version>-py3-none-any.whl[mindspore]"',
        'pip install -e ".[mindspore,dev]"',
    ):
        assert install in readme


def test_the_screenshot_the_docs_show_is_there() -> None:
    assert (DOCS / "images" / "run-page.png").stat().st_size > 10_000
    assert "images/run-page.png" in (DOCS / "dashboard.md").read_text()
    assert "docs/images/run-page.png" in (REPO / "README.md").read_text()


def test_readme_and_docs_link_each_reference_page() -> None:
    readme = (REPO / "README.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name})" in readme, page.name


def test_every_alert_rule_has_a_row_in_the_alerts_table() -> None:
    from mindwatch.alerts.registry import rule_specs

    text = (DOCS / "alerts.md").read_text()
    table = text.split("## Rules", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    for spec in rule_specs():
        assert any(f"`{spec.key}`" in row or f"`alerts.{spec.key}`" in row for row in rows), spec.key
