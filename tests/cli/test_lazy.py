"""Subcommands attached by name (cudask.cli.lazy): listed without being imported, loaded
when they run; `cudask bench` is one, and its listing says what the command says."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cudask.cli.lazy import LazyCommand, LazyGroup
from cudask.cli.main import LAZY_COMMANDS, cli


def group(*lazy: LazyCommand) -> click.Group:
    @click.group(cls=LazyGroup, lazy=lazy)
    def top() -> None:
        """A group."""

    @top.command("here")
    def here() -> None:
        click.echo("here ran")

    return top


def test_listing_imports_nothing() -> None:
    top = group(LazyCommand("away", "no_such_module_anywhere:command", "Lives elsewhere."))
    result = CliRunner().invoke(top, ["--help"])
    assert result.exit_code == 0, result.output
    assert "away  Lives elsewhere." in result.output and "here" in result.output
    assert CliRunner().invoke(top, ["here"]).output == "here ran\n"
    failed = CliRunner().invoke(top, ["away"])
    assert isinstance(failed.exception, ModuleNotFoundError)  # only running it imports


def test_running_loads_the_command_once() -> None:
    target = "cudask.cli.info:info"
    top = group(LazyCommand("gpus", target, "List every GPU."))
    result = CliRunner().invoke(top, ["gpus", "--help"])
    assert result.exit_code == 0 and "--json" in result.output
    assert top.get_command(click.Context(top), "gpus") is LazyCommand("gpus", target, "").load()


def test_a_target_that_is_no_command_is_refused() -> None:
    with pytest.raises(TypeError, match="is not a click command"):
        LazyCommand("x", "cudask.cli.main:LAZY_COMMANDS", "").load()


@pytest.mark.parametrize("lazy", LAZY_COMMANDS, ids=lambda c: c.name)
def test_the_listing_says_what_the_command_says(lazy: LazyCommand) -> None:
    command = lazy.load()
    first_paragraph = " ".join((command.help or "").split("\n\n")[0].split())
    assert lazy.summary == first_paragraph
    top = group(lazy)
    listed = top.get_command(click.Context(top), lazy.name)
    assert listed is not None and listed is not command
    for limit in (45, 80, 500):
        assert listed.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_cudask_bench_runs_through_cudask() -> None:
    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0
    for name in ("spill", "cupy", "startup", "soak", "transfer", "chart"):
        assert f"  {name} " in result.output
