"""`cudask worker --help` in sections, as `dask cuda worker` groups its flags, with other
options named by their flags; `cudask options` for a terminal and as docs/options.md;
`cudask bench --help` naming a run that needs no GPU."""

from __future__ import annotations

import re

from click.testing import CliRunner

from cudask.cli.main import cli
from cudask.options import BY_NAME, GROUPS, OPTIONS, options_for, reference


def _sections(text: str) -> dict[str, str]:
    """{title: its lines} of a --help text."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_worker_help_groups_every_flag_under_its_section() -> None:
    text = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output
    sections = _sections(text)
    assert list(sections)[-len(GROUPS) - 1 :] == [*GROUPS.values(), "Other options"], list(sections)
    for opt in options_for("cli"):
        assert opt.cli_flag in sections[GROUPS[opt.group]], (opt.name, opt.group)
    assert "--help" in sections["Other options"]


def test_worker_help_names_options_as_flags() -> None:
    text = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output
    named = [name for name in BY_NAME if "_" in name and re.search(rf"\b{name}\b", text)]
    assert named == [], named
    assert "needs --rmm-pool-size or --rmm-async" in " ".join(text.split())


def test_kubernetes_help_puts_the_pods_first() -> None:
    text = CliRunner().invoke(cli, ["kubernetes", "manifest", "--help"], terminal_width=200).output
    sections = _sections(text)
    assert next(iter(sections)) == "Pods", list(sections)
    assert "--image" in sections["Pods"] and "--device-memory-limit" in sections[GROUPS["memory"]]


def test_options_reads_in_a_terminal_and_as_markdown() -> None:
    plain = CliRunner().invoke(cli, ["options"], terminal_width=100)
    assert plain.exit_code == 0 and "|---|" not in plain.output, plain.output
    lines = plain.output.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    for opt in OPTIONS:
        assert any(
            line.lstrip().startswith(opt.cluster_keyword if "cluster" in opt.surfaces else opt.name)
            and opt.cli_flag in line
            for line in lines
        ), opt.name
    markdown = CliRunner().invoke(cli, ["options", "--markdown"])
    assert markdown.exit_code == 0 and markdown.output == reference()


def test_bench_help_names_the_run_without_a_gpu() -> None:
    from cudask_bench.cli.plan import cpu_check_command

    text = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200).output
    assert cpu_check_command("spill") in " ".join(text.split()), text
