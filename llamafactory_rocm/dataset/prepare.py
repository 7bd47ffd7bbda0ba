"""``prepare``: LLaMA-Factory's own ``get_dataset`` (template, tokenizer, cutoff_len, packing) on CPU,
saved at ``tokenized_path`` so the GPU box loads it instead of preprocessing again.

One pass: what is saved is what LLaMA-Factory saves itself (its ``get_dataset`` with ``tokenized_path``).
The counts are watched during that pass, as LLaMA-Factory computes them, never recomputed:

- ``infer_seqlen`` (``llamafactory/data/processor/processor_utils.py``), which every template-based
  processor calls with the untruncated source and target lengths and which returns the truncated ones;
- the template's ``encode_multiturn`` (the supervised processors: every turn's untruncated length,
  turns that ``cutoff_len`` leaves out entirely included);
- each processor's ``_encode_data_example`` (one call per example that passed its drop rule) and
  ``preprocess_dataset`` (the rows fed in), and ``greedy_knapsack`` (what packing keeps).

The watchers append to files in a scratch folder, so they also work in the worker processes that
``preprocessing_num_workers`` forks. Everything patched is restored when the pass ends.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError, one_line
from ..findings import Finding, Level
from ..lf import library
from ..lf.patching import Patches, progress_bars_off
from ..lf.work import work_of
from .findings import config_dataset_findings
from .info import reason

RECORD = "llamafactory_rocm_prepare.json"  # beside LLaMA-Factory's files in tokenized_path
CPU_ONLY_DROPS = ("deepspeed", "fp16", "bf16", "pure_bf16", "fsdp", "fsdp_config", "ddp_timeout")
SAID = 303  # LLaMA-Factory's words in a usage error: at most 300 characters and "..."
_TEMPLATE_PROCESSORS = ("supervised", "pairwise", "feedback", "unsupervised")  # those calling infer_seqlen


@dataclass
class PrepareResult:
    ok: bool
    examples: int = 0  # rows LLaMA-Factory fed to the training set's processor
    kept: int = 0
    dropped: int = 0
    truncated: int | None = 0  # None: not counted (stage pt: its processor calls no infer_seqlen)
    tokens: int = 0
    cutoff_len: int = 0  # as LLaMA-Factory parsed it (packing: 1 less than the config says)
    packing: bool = False
    tokenized_path: str | None = None
    lengths: dict[str, int] = field(default_factory=dict)  # untruncated, in tokens: p50, p90, p99, max
    steps_per_epoch: int | None = None
    sequences: int = 0  # rows of the tokenized train set (packed sequences when packing)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "findings": [f.model_dump(mode="json") for f in self.findings]}


def prepare(
    config: dict[str, Any],
    cwd: Path,
    *,
    tokenized_path: str | None = None,
    force: bool = False,
    world_size: int = 1,
    verbose: bool = False,
) -> PrepareResult:
    """Check the config's datasets, then tokenize them as LLaMA-Factory will and save the result.

    Not ``verbose``: no progress bars, no example print, no per-row "Dropped ..." warnings (counted)."""
    config, findings = config_dataset_findings(config, cwd)
    result = PrepareResult(ok=True, findings=findings)
    result.ok = not any(f.level is Level.ERROR for f in findings)
    if not result.ok:
        return result
    target = Path(tokenized_path or config.get("tokenized_path") or _default_path(config, cwd))
    target = target if target.is_absolute() else Path(cwd) / target
    if target.exists() and any(target.iterdir()) and not force:
        raise UsageError(
            f"{target} already holds a tokenized dataset (LLaMA-Factory would load it and ignore the data). "
            "Pass --force to rebuild it, or name another with tokenized_path=..."
        )
    with tempfile.TemporaryDirectory(prefix="lfr-prepare-") as scratch, _logs_on_stderr(verbose):
        staging = target.parent / f".{target.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        run = _Run(config, Path(scratch), world_size)
        with _Watch(Path(scratch) / "seen", run.template) as watch:
            train = run.tokenize(staging)
        _fill(result, run, train, watch)  # the watch's notes are in the scratch folder
        _replace(staging, target, config)
    result.tokenized_path = str(target)
    result.warnings += run.template_warnings()
    return result


@contextlib.contextmanager
def _logs_on_stderr(verbose: bool) -> Iterator[None]:
    """LLaMA-Factory prints examples and logs on stdout; stdout is kept for the report (--json).

    Not verbose: its prints (the example's token dump) are dropped, datasets' progress bars are off and
    the processors' per-row "Dropped ..." warnings are filtered out (the summary counts them)."""

    library.get_logger("llamafactory")  # its handler exists from here on
    handlers = logging.getLogger("llamafactory").handlers
    with Patches() as patches:
        for handler in handlers:
            if getattr(handler, "stream", None) is sys.stdout:
                patches.callback(handler.setStream, sys.stdout)
                handler.setStream(sys.stderr)
        if not verbose:
            progress_bars_off(patches)
            row_drops = _RowDrops()
            for handler in handlers:
                patches.callback(handler.removeFilter, row_drops)
                handler.addFilter(row_drops)
        patches.enter_context(contextlib.redirect_stdout(sys.stderr if verbose else io.StringIO()))
        yield


class _RowDrops(logging.Filter):
    """Lines the summary replaces: the processors' one-warning-per-row drops ("Dropped invalid example:
    ...", "Dropped lengthy ...", counted as dropped), and ``get_train_args``' "We recommend enable mixed
    precision training", which is about the fp16/bf16 keys prepare itself removes (CPU_ONLY_DROPS)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if record.name.startswith(library.PROCESSORS) and text.startswith("Dropped "):
            return False
        return not (record.name == "llamafactory.hparams.parser" and "mixed precision" in text)


def _default_path(config: dict[str, Any], cwd: Path) -> Path:
    """Named after what decides the tokens: the model, template, data and their limits."""
    keys = ("model_name_or_path", "template", "dataset", "eval_dataset", "dataset_dir", "cutoff_len", "packing")
    keys += ("max_samples", "val_size", "stage", "train_on_prompt", "mask_history")
    digest = hashlib.sha256(json.dumps({k: config.get(k) for k in keys}, sort_keys=True, default=str).encode())
    return Path(cwd) / "tokenized" / digest.hexdigest()[:12]


class _Run:
    """LLaMA-Factory's argument parser, tokenizer and template, on CPU."""

    def __init__(self, config: dict[str, Any], scratch: Path, world_size: int) -> None:
        from ..lf.stages import data_stage

        self.config = {k: v for k, v in config.items() if k not in CPU_ONLY_DROPS}
        self.config.update(output_dir=str(scratch / "out"), report_to="none", overwrite_cache=True)
        self.config.update(cache_dir=str(scratch / "cache"), do_train=True)
        self.config.pop("tokenized_path", None)
        self.world_size = world_size
        try:
            parsed = library.get_train_args(self.config)
            self.model_args, self.data_args, self.training_args, self.finetuning_args, _ = parsed
            self.tokenizer_module = library.load_tokenizer(self.model_args)
        except (Exception, SystemExit) as err:  # the tokenizer is not reachable, or LF refuses the config
            said = one_line(err, limit=SAID, cause=False)
            raise UsageError(f"LLaMA-Factory cannot load the tokenizer or the config: {said}") from None
        self.tokenizer = self.tokenizer_module["tokenizer"]
        self.data_stage = data_stage(self.finetuning_args.stage)  # what the workflow passes: run_dpo -> "rm"
        self.own_template = getattr(self.tokenizer, "chat_template", None)  # before LF may replace it
        self.template = library.template_and_fix_tokenizer(self.tokenizer, self.data_args)

    def tokenize(self, staging: Path) -> Any:
        """LLaMA-Factory's ``get_dataset``, once, saving at ``staging``; returns the train set."""
        try:
            with Patches() as patches:
                patches.setattr(self.data_args, "tokenized_path", str(staging))  # None again after (popped above)
                module = library.get_dataset(
                    self.template, self.model_args, self.data_args, self.training_args, self.data_stage,
                    **self.tokenizer_module,
                )  # fmt: skip
        except (Exception, SystemExit) as err:
            raise UsageError(f"LLaMA-Factory's preprocessing stops: {one_line(err, limit=SAID, cause=False)}") from None
        return module["train_dataset"]

    def template_warnings(self) -> list[str]:
        """The model's own chat template against LLaMA-Factory's ``template:``, on one exchange."""
        name = self.data_args.template
        if not self.own_template:
            return [f"the model has no chat template of its own: template {name!r} decides the prompt format"]
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        try:
            own = self.tokenizer.apply_chat_template(messages, chat_template=self.own_template, tokenize=True)
            if hasattr(own, "keys"):  # newer transformers return a BatchEncoding
                own = own["input_ids"]
        except Exception as err:
            said = one_line(err, limit=SAID, cause=False)
            return [f"the model's own chat template cannot be rendered ({said}); template {name!r} is used"]
        prompt, answer = self.template.encode_oneturn(self.tokenizer, messages)
        if list(own) == prompt + answer:
            return []
        ours = self.tokenizer.decode(prompt + answer)
        theirs = self.tokenizer.decode(list(own))
        return [
            f"template {name!r} and the model's own chat template disagree: {ours!r} (template) vs {theirs!r} "
            "(model): the model is trained on one format and may be prompted with the other; check `template:`"
        ]


class _Watch:
    """Notes what LLaMA-Factory's own pass computes (see the module's docstring); restores all on exit.

    Per example that passes a processor's drop rule: its untruncated length, its length as saved, and
    whether ``cutoff_len`` cut it. Per batch: the rows fed in and, when packing, what ``greedy_knapsack``
    received (the examples packing keeps, and their tokens). Per dataset: the rows loaded."""

    def __init__(self, folder: Path, template: Any) -> None:
        self.folder = folder
        self.template_class = type(template)
        self.loaded: list[int] = []  # rows of each training dataset, in the order of ``dataset:``
        self.phase = "train"
        self._merges = 0
        self._patches = Patches()
        self._batch: dict[str, Any] = {}
        self._example: dict[str, Any] = {}

    # -- set-up and tear-down
    def __enter__(self) -> _Watch:
        loader = library.data_loader()
        self.folder.mkdir(parents=True, exist_ok=True)
        global _ACTIVE
        _ACTIVE = self
        self._patch(loader, "_load_single_dataset", self._on_load)
        self._patch(loader, "_get_merged_dataset", self._on_merge)
        self._patch(loader, "_get_preprocessed_dataset", self._on_preprocess)
        for name in _TEMPLATE_PROCESSORS:
            module = library.data_processors(name)
            self._patch(module, "infer_seqlen", self._on_infer_seqlen)
        supervised = library.data_processors("supervised")
        self.supervised = supervised.SupervisedDatasetProcessor
        self._patch(supervised, "greedy_knapsack", self._on_knapsack)
        self._patch(self.template_class, "encode_multiturn", self._on_encode_multiturn, method=True)
        processors = library.data_processors()
        classes = {c for c in vars(processors).values() if isinstance(c, type) and hasattr(c, "preprocess_dataset")}
        for cls in classes:
            self._patch(cls, "preprocess_dataset", self._on_batch, method=True)
            if "_encode_data_example" in vars(cls):
                self._patch(cls, "_encode_data_example", self._on_example, method=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._patches.undo()
        global _ACTIVE
        _ACTIVE = None

    def _patch(self, owner: Any, name: str, hook: Callable[..., Any], method: bool = False) -> None:
        self._patches.callback(_ORIGINALS.pop, (owner, name), None)  # undone after the name is put back
        original = self._patches.setattr(owner, name, _Hooked(owner, name))
        _ORIGINALS[(owner, name)] = (original, hook.__name__, method)

    # -- in the main process
    def _on_merge(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.phase = "train" if self._merges == 0 else "eval"  # get_dataset merges the training datasets first
        self._merges += 1
        try:
            return original(*args, **kwargs)
        finally:
            self.phase = "eval"

    def _on_load(self, original: Callable[..., Any], dataset_attr: Any, *args: Any, **kwargs: Any) -> Any:
        dataset = original(dataset_attr, *args, **kwargs)
        if self.phase == "train":
            with contextlib.suppress(TypeError):  # a streamed dataset has no length
                self.loaded.append(len(dataset))
        return dataset

    def _on_preprocess(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.phase = "eval" if kwargs.get("is_eval") else "train"
        try:
            return original(*args, **kwargs)
        finally:
            self.phase = "eval"

    # -- in whichever process runs the batch (forked workers included)
    def _on_batch(self, original: Callable[..., Any], processor: Any, examples: dict[str, Any]) -> Any:
        self._batch = {"phase": self.phase, "rows": len(examples["_prompt"]), "full": [], "saved": [], "cut": 0}
        self._batch.update(packed=0, packed_tokens=0)
        out = original(examples)
        with open(self.folder / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as file:
            file.write(json.dumps(self._batch) + "\n")
        return out

    def _on_example(self, original: Callable[..., Any], processor: Any, *args: Any, **kwargs: Any) -> Any:
        self._example = {"pairs": None, "calls": []}
        out = original(*args, **kwargs)
        saved, pairs, calls = len(out[0]), self._example["pairs"], self._example["calls"]
        if isinstance(processor, self.supervised) and pairs is not None:
            lost = pairs - sum(kept for _, kept in calls)  # turns never reached count whole
            full = saved + lost
        elif calls:  # one exchange: the first call is the example (feedback's second is its KL pair)
            full, kept = calls[0]
            lost = full - kept
        else:
            return out
        self._batch["full"].append(full)
        self._batch["saved"].append(saved)
        self._batch["cut"] += 1 if lost > 0 else 0
        return out

    def _on_encode_multiturn(self, original: Callable[..., Any], template: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = original(*args, **kwargs)
        self._example["pairs"] = sum(len(source) + len(target) for source, target in pairs)
        return pairs

    def _on_infer_seqlen(self, original: Callable[..., Any], source_len: int, target_len: int, cutoff: int) -> Any:
        new_source, new_target = original(source_len, target_len, cutoff)
        self._example.setdefault("calls", []).append((source_len + target_len, new_source + new_target))
        return new_source, new_target

    def _on_knapsack(self, original: Callable[..., Any], numbers: list[int], capacity: int) -> Any:
        self._batch["packed"] += len(numbers)
        self._batch["packed_tokens"] += sum(numbers)
        return original(numbers, capacity)

    # -- read back
    def batches(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.folder.glob("*.jsonl")):
            found += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return [b for b in found if b["phase"] == "train"]


_ACTIVE: _Watch | None = None  # the watch in use; worker processes forked by datasets inherit it
_ORIGINALS: dict[tuple[Any, str], tuple[Any, str, bool]] = {}  # (owner, name) -> (original, hook, is a method)


class _Hooked:
    """Stands in for LLaMA-Factory's function or method ``owner.name`` while a ``_Watch`` is on.

    Pickled by name (``__reduce__``), never by value: datasets hashes the processor's bound method to
    fingerprint its ``map``, and sends it to its worker processes; both then work as they do unpatched."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        return _hooked, (self.owner, self.name)

    def __get__(self, instance: Any, cls: Any = None) -> Any:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        original, hook, method = _ORIGINALS[(self.owner, self.name)]
        if _ACTIVE is None:  # a stray reference after the watch ended
            return original(*args, **kwargs)
        if method:
            this, *rest = args
            return getattr(_ACTIVE, hook)(functools.partial(original, this), this, *rest, **kwargs)
        return getattr(_ACTIVE, hook)(original, *args, **kwargs)


def _hooked(owner: Any, name: str) -> Any:
    """What a pickled ``_Hooked`` becomes again: the one installed (or, after the watch, the original)."""
    return vars(owner).get(name) if (owner, name) in _ORIGINALS else getattr(owner, name)


def _fill(result: PrepareResult, run: _Run, train: Any, watch: _Watch) -> None:
    batches = watch.batches()
    full = [n for b in batches for n in b["full"]]
    names = run.data_args.dataset or []
    result.datasets = [{"name": name, "examples": rows} for name, rows in zip(names, watch.loaded, strict=False)]
    result.examples = sum(b["rows"] for b in batches)
    result.sequences = len(train)
    result.cutoff_len, result.packing = run.data_args.cutoff_len, bool(run.data_args.packing)
    column = "input_ids" if "input_ids" in train.column_names else "chosen_input_ids"
    if not batches and result.sequences:  # worker processes started fresh (spawn), not forked: unwatched
        result.examples = result.kept = sum(watch.loaded)  # before LLaMA-Factory's drop rule
        result.truncated = None
        result.tokens = sum(len(ids) for ids in train[column])
        result.warnings.append(
            "examples, dropped and truncated not counted: LLaMA-Factory's worker processes were not forked "
            "(preprocessing_num_workers); the data saved is LLaMA-Factory's all the same"
        )
    elif run.data_args.packing and run.data_stage == "sft":
        result.kept = sum(b["packed"] for b in batches)
        result.tokens = sum(b["packed_tokens"] for b in batches)
    elif full:
        result.kept = len(full)
        result.tokens = sum(n for b in batches for n in b["saved"])
    else:  # pretraining: rows are chunks of cutoff_len, not examples
        result.kept = result.examples
        result.tokens = sum(len(ids) for ids in train[column])
    if batches:
        result.truncated = sum(b["cut"] for b in batches) if full else None
    result.dropped = result.examples - result.kept
    ordered = sorted(full)
    if ordered:
        rank = lambda p: ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)]  # noqa: E731
        result.lengths = {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1]}
    args = run.training_args
    if result.sequences:  # as the trainer counts them (lf/work.py)
        result.steps_per_epoch = work_of(args, result.sequences, run.world_size).steps_per_epoch
    if result.kept == 0:
        result.ok = False


def _replace(staging: Path, target: Path, config: dict[str, Any]) -> None:
    """The new tokenized folder takes the target's place by renames: never half of one."""
    record = {"dataset": config.get("dataset"), "model": config.get("model_name_or_path"), "config": config}
    (staging / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    old = target.parent / f".{target.name}.old"
    try:
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        staging.rename(target)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {reason(err)}") from None
    shutil.rmtree(old, ignore_errors=True)
