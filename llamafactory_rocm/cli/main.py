"""``llamafactory-rocm``: the command line; one small module per subcommand, thin over the Python API."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import DEBUG_ENV, EXIT_INTERNAL, EXIT_USAGE, UsageError
from . import check_cmd, datasets_cmd, demo_cmd, doctor_cmd, explain_cmd, prepare_cmd, presets_cmd, train_cmd

DESCRIPTION = (
    "LoRA fine-tuning with LLaMA-Factory on AMD GPUs that works the first time: check a config before "
    "the GPU-hours start, train through LLaMA-Factory's own trainer, presets per GPU, datasets."
)
EXAMPLES = """examples:
  llamafactory-rocm demo                                   # a tiny fine-tune on this machine, no download
  llamafactory-rocm check my_run.yaml --gpu mi300x         # will it run there? what would change?
  llamafactory-rocm train my_run.yaml                      # check, record, then LLaMA-Factory trains
  llamafactory-rocm explain MEMORY_OVER_DEVICE             # what a finding means and how to fix it
Each command has its own help: llamafactory-rocm check -h"""

SUBCOMMANDS = (check_cmd, train_cmd, prepare_cmd, presets_cmd, datasets_cmd, doctor_cmd, demo_cmd, explain_cmd)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--gp` must not become --gpu: it may be LLaMA-Factory's
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # examples keep their lines
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # argparse would print the whole usage block
        print(f"llamafactory-rocm: {message}. Try `llamafactory-rocm {self._sub_hint()}-h`.", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def _sub_hint(self) -> str:
        parts = self.prog.split()[1:]
        return " ".join(parts) + " " if parts else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llamafactory-rocm", description=DESCRIPTION, epilog=EXAMPLES)
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in SUBCOMMANDS:
        module.register(subs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a file name or key that is not UTF-8 still prints, escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "takes_launch_args", False):  # check/train: the rest is LLaMA-Factory's, in order
        args.launch_args, extra = extra, []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.run(args) or 0)
    except UsageError as err:
        print(f"llamafactory-rocm {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("llamafactory-rocm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head` closed the output: stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error when Python flushes at exit
        return 141
    except OSError as err:  # a file that cannot be read or written: the user's to fix
        if _shown_as_raised():
            raise
        print(f"llamafactory-rocm {args.command}: {_os_error(err)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # ours, before the hand-over: one line, never a traceback
        if _shown_as_raised():
            raise
        print(
            f"llamafactory-rocm {args.command}: unexpected {type(err).__name__}: {err}. This is a bug in "
            f"llamafactory-rocm: please report it ({DEBUG_ENV}=1 shows the traceback).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _shown_as_raised() -> bool:
    """LLaMA-Factory's own errors once it runs, and every error when debugging, keep their traceback."""
    launch = sys.modules.get("llamafactory_rocm.train.launch")
    return bool(launch is not None and launch.HANDED_OVER) or os.environ.get(DEBUG_ENV) == "1"


def _os_error(err: OSError) -> str:
    """``cannot use PATH: Permission denied``, or the error as it reads."""
    if err.filename is None:
        return f"{err.strerror or err}"
    return f"cannot use {err.filename}: {err.strerror or err}. Check the path and its permissions"


if __name__ == "__main__":
    sys.exit(main())
