"""Help written for users: every command and option says what it does, every command shows an example."""

from __future__ import annotations

import argparse

from llamafactory_rocm.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser, path: str = "llamafactory-rocm"):
    """(path, parser) for the top level and every subcommand, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{path} {name} has no one-line help"
                yield from _commands(sub, f"{path} {name}")


def test_every_option_and_argument_has_help():
    missing = [
        f"{path}: {action.option_strings or action.dest}"
        for path, parser in _commands(build_parser())
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help
    ]
    assert missing == []


def test_every_command_shows_an_example_of_itself_and_of_each_of_its_verbs():
    for path, parser in _commands(build_parser()):
        words = path.split()
        if len(words) == 1:
            continue  # the top level shows examples of several commands
        # a verb (`presets copy`) may be shown by its own examples or by its command's
        parent = dict(_commands(build_parser()))[" ".join(words[:-1])] if len(words) == 3 else None
        shown = (parser.epilog or "") + ((parent.epilog or "") if parent is not None else "")
        assert "examples:" in shown, path
        assert f"llamafactory-rocm {' '.join(words[1:])}" in shown, f"{path}: no example runs it"


def test_help_speaks_to_users_not_developers():
    text = "\n".join(parser.format_help() for _, parser in _commands(build_parser()))
    for developer_word in ("thin over the Python API", "one small module", "subcommand"):
        assert developer_word not in text


def test_counts_and_names_read_as_english():
    from llamafactory_rocm.check.run import check_config
    from llamafactory_rocm.dataset.validate import rows

    assert (rows(1), rows(0), rows(3)) == ("1 row", "0 rows", "3 rows")
    config = {"dataset": "amd_finetune_qa", "dataset_dir": "no-such-dir", "stage": "sft"}
    (bundled,) = [f for f in check_config(config).findings if f.code == "DATASET_DIR_BUNDLED"]
    assert "amd_finetune_qa is bundled" in bundled.message
