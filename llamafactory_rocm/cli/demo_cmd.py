"""``llamafactory-rocm demo``: a real LoRA fine-tune of a tiny local model on CPU, in about a minute."""

from __future__ import annotations

import argparse
import textwrap
import time
from pathlib import Path

from ..errors import EXIT_FINDINGS

DESCRIPTION = """\
Builds a tiny Llama locally, then fine-tunes it with LoRA through LLaMA-Factory's own trainer on
the bundled AMD Q&A data, from a config written the way blog posts write it (fp16, compute_dtype,
backend), so the check's rewrites show too. Prints the loss it reached, a question it trained on
answered before and after, and where the loss plot, the adapter and the launch record are.
No GPU and no model download needed.
"""

EPILOG = """\
where things go (DIR is --dir, ./llamafactory_rocm_demo by default):
  DIR/tiny-llama/          the tiny model and tokenizer, built on the first run and reused
  DIR/demo_config.yaml     the blog-style config the demo trains with (.1, .2 ... on later runs)
  DIR/run/                 the adapter, training_loss.png and the launch record (run.1, run.2 ...)

examples:
  llamafactory-rocm demo
  llamafactory-rocm demo --dir /tmp/lf-demo --max-steps 50
"""


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1 (argparse turns the error into one line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value}")
    return value


def register(subs: argparse._SubParsersAction) -> None:
    from ..demo import DEFAULT_STEPS

    p = subs.add_parser(
        "demo",
        help="fine-tune a tiny local model on the bundled dataset (CPU, about a minute, no download)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dir",
        default="llamafactory_rocm_demo",
        metavar="DIR",
        help="work folder for the tiny model and the runs (default: ./%(default)s)",
    )
    p.add_argument(
        "--max-steps",
        type=positive_int,
        default=DEFAULT_STEPS,
        metavar="N",
        help="training steps, at least 1 (default: %(default)s; a few steps run, but learn little)",
    )
    p.set_defaults(run=run)


def _quote(text: str, width: int = 100) -> str:
    return textwrap.shorten(text, width=width, placeholder=" ...") or "(nothing)"


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()  # before the imports: transformers and torch take seconds to load
    from ..demo import run_demo
    from ..train.summary import format_summary_line

    result = run_demo(Path(args.dir), max_steps=args.max_steps)
    if result.exit_code != 0:
        return result.exit_code
    if result.adapter is None or result.first_loss is None:
        print(f"demo: training ended but no adapter or logged loss was found in {result.output_dir}")
        return EXIT_FINDINGS
    print()
    if result.answers is not None:
        a = result.answers
        print(f"demo: a question it trained on: {a.question}")
        print(f"  before training: {_quote(a.before)}")
        print(f"  after training:  {_quote(a.after)}")
        print(f"  bundled answer:  {_quote(a.reference)}")
    line = format_summary_line(result.summary) if result.summary else f"loss {result.first_loss:.3f} -> ..."
    print(f"demo: {line}")
    if result.uniform_loss is not None and result.last_loss is not None:
        print(
            f"demo: final loss {result.last_loss:.3f} = {result.last_loss / result.uniform_loss:.2f} x "
            f"ln({result.vocab_size}) = {result.uniform_loss:.3f}, the loss of a uniform guess over the vocabulary"
        )
    print(f"demo: loss plot: {result.plot or 'not written'}")
    print(f"demo: adapter: {result.adapter}")
    print(f"demo: launch record: {result.output_dir / 'rocm_launch.json'}")
    print(f"demo: done in {time.perf_counter() - start:.0f} s")
    return 0
