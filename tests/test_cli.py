"""The shape of the ``halfpi`` command line: help that says what and by default."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from halfpi.cli import build_parser


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


ALL = list(parsers(build_parser()))


def test_the_header_is_plain_text_not_restructuredtext() -> None:
    text = build_parser().format_help()
    assert "``" not in text
    assert "halfpi mind" in text  # it shows how to start


@pytest.mark.parametrize("parser", ALL, ids=[p.prog for p in ALL])
def test_every_option_says_what_it_does_and_its_default(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(
            action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
        ):
            continue  # what they do is all they do
        name = "/".join(action.option_strings) or action.dest
        text = (action.help or "").lower()
        assert action.help and len(action.help) > 10, f"{parser.prog} {name} has no help"
        if not action.option_strings or action.required:
            continue  # a positional or required value has no default
        if isinstance(action, argparse._StoreTrueAction | argparse._AppendAction):
            assert "default" in text, (
                f"{parser.prog} {name}: {action.help!r} does not say what happens without it"
            )
            continue
        assert "default" in text, f"{parser.prog} {name}: {action.help!r} names no default"
        assert "%(default)" not in action.help or action.default is not None


@pytest.mark.parametrize("parser", ALL, ids=[p.prog for p in ALL])
def test_every_parser_has_a_description(parser: argparse.ArgumentParser) -> None:
    assert parser.description, parser.prog


def test_the_help_lists_every_command() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    usage = parser.format_usage()
    text = parser.format_help()
    for name in commands.choices:
        assert name in usage, (name, usage)
        assert f"    {name} " in text, (name, text)
