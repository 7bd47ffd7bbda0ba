"""The training dry run's data step (lf/dry_run.py): LLaMA-Factory's ``get_dataset`` with the data stage the
workflow passes, or the saved ``tokenized_path`` it loads instead, and the rows it trains on.

The data pipeline reads at most ``rows_cap`` rows per dataset (LLaMA-Factory's own ``max_samples``; spread over the
dataset, not its first rows: ``_strided_rows``), with its
caches, and any ``tokenized_path`` it would save, in a temporary folder. The split (``val_size``) and the mix
(``interleave_probs``) are computed on the full row counts by LLaMA-Factory's own
``merge_dataset``/``split_dataset`` (datasets' ``interleave_datasets``/``train_test_split``) over index-only
datasets of those sizes (docs/llamafactory-launch.md#d4). A dataset that is not a local file is not read.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import one_line
from .causes import Cause, cause_of
from .dry_parts import Launch, user_offline
from .patching import Patches

# The rows read of each dataset where the rows are packed and the forecast is asked for (forecast/flops.py
# ``requested``): a packed row count is LLaMA-Factory's greedy knapsack over every row's length, so a sample's
# scaled count is not the run's steps (packing 256 of the bundled 300 QA rows, scaled, made 125 rows against
# the run's 128). LLaMA-Factory's pipeline took about 0.35 ms a row here (docs/forecast.md).
PACKED_ROWS_CAP: contextvars.ContextVar[int] = contextvars.ContextVar("packed_rows_cap", default=0)


def load_data(launch: Launch) -> None:
    from llamafactory.extras.misc import has_tokenized_data

    data_args, model_args = launch.data_args, launch.model_args
    user_tokenized = data_args.tokenized_path
    if user_tokenized is not None and has_tokenized_data(user_tokenized):
        _tokenized_data(launch, user_tokenized)
        return
    if not _workers_accepted(launch):
        return
    remote = [str(attr) for attr in _remote_attrs(launch)]
    if remote:
        if _hub_datasets_reachable_offline(launch):
            launch.run.skip("the data pipeline", f"{', '.join(remote)} is not a local file; the dry run reads none")
        return
    split = _SplitSpy(launch, data_args.streaming)
    launch.user_max_samples = data_args.max_samples
    with Patches() as patches:
        patches.setattr(data_args, "val_size", data_args.val_size)  # kept: the full-size split may set it
        if not data_args.streaming:  # LLaMA-Factory refuses max_samples with streaming (data_args.py)
            rows_cap = max(launch.rows_cap, PACKED_ROWS_CAP.get()) if data_args.packing else launch.rows_cap
            cap = _RecordingCap(min(data_args.max_samples or rows_cap, rows_cap), split)
            patches.setattr(data_args, "max_samples", cap)
            split.cap = int(cap)
            _strided_rows(patches, cap, launch.user_max_samples)
        if data_args.tokenized_path is not None:  # LLaMA-Factory would save there: save into tmp instead
            patches.setattr(data_args, "tokenized_path", str(launch.tmp / "tokenized"))
        patches.setattr(data_args, "overwrite_cache", True)
        patches.setattr(data_args, "preprocessing_num_workers", None)  # a pool costs more than a few hundred rows
        patches.setattr(model_args, "cache_dir", str(launch.tmp / "datasets-cache"))
        module = _capped_dataset(launch, split)
    if module is not None:
        _count_rows(launch, module, split)


def _capped_dataset(launch: Launch, split: _SplitSpy) -> Mapping[str, Any] | None:
    """LLaMA-Factory's ``get_dataset`` on the capped arguments; None (an error said) where it refuses."""
    from llamafactory.data import get_dataset

    try:
        with split.installed():
            return get_dataset(
                launch.template,
                launch.model_args,
                launch.data_args,
                launch.training_args,
                stage=launch.run.data_stage,
                **launch.tokenizer_module,
            )
    except Exception as exc:
        if split.error is None:  # the full-size split refused already, with datasets' words
            shards = _streamed_file_shards(launch)
            cause = (
                cause_of("DATA_PIPELINE_REFUSED", one_line(exc), launch.config)
                if shards is None
                else Cause(STREAMED_NO_ROWS, {"workers": shards}, WORKERS_KEY, {WORKERS_KEY: 1})
            )
            said = "" if shards is None else f" (a local file streamed in {shards} shard(s) reads no rows)"
            launch.run.refused(
                code="DATA_PIPELINE_REFUSED",
                message=f"LLaMA-Factory's data pipeline (get_dataset, stage={launch.run.data_stage!r} for "
                f"stage {launch.run.stage!r}) refused: {one_line(exc)}{said}",
                cause=cause,
                key="dataset",
                other="pipeline",
            )
        return None


STREAMED_NO_ROWS = "streamed file without shards"
WORKERS_KEY = "dataloader_num_workers"


def _streamed_file_shards(launch: Launch) -> int | None:
    """The shard count where a local file is streamed in shards that hold no rows, else None.

    LLaMA-Factory streams a local file as ``dataset.to_iterable_dataset(num_shards=dataloader_num_workers)``
    (data/loader.py ``_load_single_dataset``, 0.9.5 and main: tests/test_refusal_fixes.py); at the default 0
    the stream is empty and the run stops at the first read with a bare StopIteration (converter.py
    ``align_dataset``). Whether a shard count reads no rows is asked of datasets' own ``to_iterable_dataset``."""
    from datasets import Dataset

    workers = launch.training_args.dataloader_num_workers
    if not launch.data_args.streaming or not any(attr.load_from == "file" for attr in _dataset_attrs(launch)):
        return None
    try:
        empty = next(iter(Dataset.from_dict({"row": [0]}).to_iterable_dataset(num_shards=workers)), None) is None
    except Exception:  # datasets refuses that shard count itself: its own words stand
        return None
    return workers if empty else None


def _workers_accepted(launch: Launch) -> bool:
    """``preprocessing_num_workers`` as datasets takes it: LLaMA-Factory passes it as ``num_proc`` to
    ``load_dataset`` and every ``Dataset.map`` (data/loader.py, data/converter.py); the pipeline below runs
    without a pool, so datasets' own ``map`` is asked here, on one row (no pool is started for one row)."""
    from datasets import Dataset

    workers = launch.data_args.preprocessing_num_workers
    if workers is None:
        return True
    try:
        Dataset.from_dict({"row": [0]}).map(lambda row: row, num_proc=workers)
    except (ValueError, TypeError) as exc:
        launch.run.error(
            code="DATA_WORKERS_REFUSED",
            message=f"datasets refuses preprocessing_num_workers {workers!r}, which LLaMA-Factory passes as "
            f"num_proc to load_dataset and Dataset.map: {one_line(exc)}",
            key="preprocessing_num_workers",
            remedy={"preprocessing_num_workers": None},
        )
        return False
    return True


def _dataset_attrs(launch: Launch) -> list[Any]:
    from llamafactory.data.parser import get_dataset_list

    names = [*(launch.data_args.dataset or []), *(launch.data_args.eval_dataset or [])]
    try:
        return get_dataset_list(names, launch.data_args.dataset_dir)
    except Exception:
        return []  # get_dataset raises it again, in LLaMA-Factory's words


def _remote_attrs(launch: Launch) -> list[Any]:
    return [attr for attr in _dataset_attrs(launch) if attr.load_from != "file"]


def _hub_datasets_reachable_offline(launch: Launch) -> bool:
    """Under the user's HF_DATASETS_OFFLINE (or HF_HUB_OFFLINE), a Hugging Face Hub dataset loads only from
    the cache: datasets' own ``load_dataset_builder`` (the first part of the ``load_dataset`` LLaMA-Factory
    calls, data/loader.py ``_load_single_dataset``) with its offline switch on answers from the cache, or
    raises as the run would. False (an error said) when one cannot be loaded; True otherwise (online: not
    checked)."""
    if launch.planned or not user_offline("datasets"):
        return True
    import datasets.config

    from datasets import load_dataset_builder

    with Patches() as patches:
        patches.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        for attr in _remote_attrs(launch):
            if attr.load_from != "hf_hub":
                continue  # ModelScope, Modelers, scripts: their own downloads
            try:
                load_dataset_builder(
                    attr.dataset_name,
                    name=attr.subset,
                    data_dir=attr.folder,
                    cache_dir=launch.model_args.cache_dir,
                    token=launch.model_args.hf_hub_token,
                )
            except Exception as exc:
                launch.run.error(
                    code="DATASET_NOT_IN_CACHE_OFFLINE",
                    message=f"dataset {attr} is a Hugging Face Hub dataset not in the cache, and the environment "
                    "is offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE): datasets' load_dataset_builder: "
                    f"{one_line(exc)}",
                    fix_with={"dataset": attr.dataset_name},
                    key="dataset",
                )
                return False
    return True


def _count_rows(launch: Launch, module: Mapping[str, Any], split: _SplitSpy) -> None:
    train = module.get("train_dataset")
    if launch.data_args.streaming:
        read = _streamed_rows(launch, train)
        launch.run.skip(
            "row counts", f"streaming: the stream has no length, the trainer runs max_steps; its first {read} rows read"
        )
        return
    evals = module.get("eval_dataset")
    rows = {"train": len(train) if train is not None else 0}
    if train is not None:
        _record_lengths(launch.run, train)
        launch.run.train_row_weights = _row_weights(launch, split)
    if isinstance(evals, dict):
        rows["eval"] = sum(len(d) for d in evals.values())
    else:
        rows["eval"] = len(evals) if evals is not None else 0
    if split.capped and split.full and split.dry:
        # Rows kept by the processors, scaled from the capped rows to the full split: exact where they kept
        # every row they read one for one, an estimate where they packed or dropped rows
        if rows["train"] != split.dry["train"]:
            launch.run.train_rows_scaled = (rows["train"], split.dry["train"], split.full["train"])
        rows = {
            part: round(n * split.full[part] / split.dry[part]) if split.dry.get(part) else 0
            for part, n in rows.items()
        }
        launch.run.rows_estimated = True
    launch.run.rows = rows
    launch.train_rows = rows["train"]


# at most this many rows' lengths a forecast weighs (a weighted row counts as that many): mixing a dataset
# 1,000 times the size of another leaves the smaller at most 4 times its share
WEIGHED_ROWS = 65536
WEIGHT_STEPS = 16


def _row_weights(launch: Launch, split: _SplitSpy) -> tuple[int, ...] | None:
    """How many times each train row counts for the run's tokens where its datasets were read in other shares
    than the run mixes them: 256 rows of a 10,000-row dataset and all 300 of another stand for 10,000 and 300
    rows (``mix_strategy: concat``, LLaMA-Factory's default). A train row's dataset is told by where it sits among
    the processed rows (the datasets' read rows one after another; ``_positions``), so only where the pipeline
    kept each row read as one row; elsewhere the rows count once each, and the forecast says so. None where the
    rows read stand each for as many of the run's."""
    data_args = launch.data_args
    datasets = len(data_args.dataset or [])
    # each dataset's rows read (LLaMA-Factory's select(range(min(max_samples, len)))) and rows the run trains on
    seen, rows_run = split.seen[:datasets], split.run_rows()[:datasets]
    reads = [(min(split.cap, n), rows) for n, rows in zip(seen, rows_run, strict=True)]
    if len(reads) != datasets or datasets < 2 or len({rows / read for read, rows in reads if read}) < 2:
        return None  # one dataset, or each read in the same share of its rows: the sample's shares are the run's
    positions = split.train_positions
    if (
        data_args.mix_strategy != "concat"
        or data_args.packing
        or split.merged_rows != sum(read for read, _ in reads)
        or positions is None
        or len(positions) != split.dry.get("train")
    ):
        launch.run.forecast["tokens_note"] = (
            f"tokens: the rows read of the {datasets} datasets count once each, not in the shares the run mixes "
            f"them ({', '.join(f'{read:,} of {rows:,}' for read, rows in reads)} rows read; mix_strategy "
            f"{data_args.mix_strategy}, packing {data_args.packing}: their rows are not told apart after the "
            "pipeline)"
        )
        return None
    ratios = [rows / read for read, rows in reads]
    # the least weighed row counts WEIGHT_STEPS times, so each weight is within 1/32 of its ratio; fewer where
    # that would weigh more rows than WEIGHED_ROWS
    scale = min(WEIGHT_STEPS, WEIGHED_ROWS / sum(rows for _, rows in reads) * min(ratios))
    counts = [max(1, round(ratio / min(ratios) * scale)) for ratio in ratios]
    ends = list(itertools.accumulate(read for read, _ in reads))
    return tuple(counts[bisect.bisect_right(ends, position)] for position in positions)


def _positions(merged: Any, train: Any) -> list[int] | None:
    """Where each row of the train split sits among the processed rows ``merged`` that LLaMA-Factory's
    ``split_dataset`` was given: all of them in order where it made no split (the same object), the indices
    datasets' ``train_test_split`` drew where it split (``Dataset._indices``, the mapping datasets' own
    ``select`` keeps); None where not known."""
    if train is None:
        return None
    if train is merged:
        return list(range(_length(merged)))
    indices = getattr(train, "_indices", None)
    if indices is None or getattr(indices, "num_columns", 0) != 1:
        return None
    return [int(i) for i in indices.column(0).to_pylist()]


def _record_lengths(run: Any, train: Any) -> None:
    """Each train row's tokens (``train``: a Dataset, or a dict of columns): sft/pt rows and kto's target rows
    (input_ids; kto's KL rows apart), dpo/rm pairs (the longer of the two, and both's tokens)."""
    columns = set(train.column_names) if hasattr(train, "column_names") else set(train)
    if "input_ids" in columns:
        run.train_lengths = tuple(len(ids) for ids in train["input_ids"])
        if "kl_input_ids" in columns:
            run.train_kl_lengths = tuple(len(ids) for ids in train["kl_input_ids"])
    elif {"chosen_input_ids", "rejected_input_ids"} <= columns:
        pairs = list(zip(train["chosen_input_ids"], train["rejected_input_ids"], strict=True))
        run.train_lengths = tuple(max(len(chosen), len(rejected)) for chosen, rejected in pairs)
        run.train_pair_tokens = tuple(len(chosen) + len(rejected) for chosen, rejected in pairs)


# The most rows of a stream read for their lengths: a streamed run's steps read max_steps x accumulation x batch
# rows; up to this many are read (LLaMA-Factory's pipeline took about 0.35 ms a row here, docs/forecast.md)
STREAM_ROWS_READ = 4096


def _streamed_rows(launch: Launch, train: Any) -> int:
    """The lengths of the first rows of the train stream, in the order the run's dataloader reads them: a torch
    DataLoader over LLaMA-Factory's stream (its ``split_dataset`` shuffled it in a buffer with the run's seed,
    which the trainer's first pass keeps) with the run's batch size and ``dataloader_num_workers`` (each worker
    batches its own shards, the loader takes the workers' batches in turn); as many rows as the run's steps read
    (``max_steps``), at least ``rows_cap``, at most ``STREAM_ROWS_READ``; the count read. The stream's first row
    costs its shuffle buffer's rows (``buffer_size``) processed."""
    import itertools

    import torch

    args = launch.training_args
    batch = max(args.per_device_train_batch_size, 1)
    steps_rows = max(args.max_steps, 0) * args.gradient_accumulation_steps * batch * max(args.world_size, 1)
    wanted = min(max(steps_rows, launch.rows_cap), STREAM_ROWS_READ)
    if train is None:
        return 0
    loader = torch.utils.data.DataLoader(
        train, batch_size=batch, num_workers=args.dataloader_num_workers, collate_fn=list,
        drop_last=args.dataloader_drop_last,
    )  # fmt: skip
    rows = [row for rows in itertools.islice(loader, -(-wanted // batch)) for row in rows]
    if rows:
        _record_lengths(launch.run, {key: [row[key] for row in rows] for key in rows[0]})
    return len(rows)


def _tokenized_data(launch: Launch, path: str) -> None:
    """LLaMA-Factory loads a saved ``tokenized_path`` instead of the data: its ids must fit the model."""
    from datasets import load_from_disk

    tokenizer = launch.tokenizer_module["tokenizer"]
    try:
        saved = load_from_disk(path)
    except Exception as exc:
        launch.run.error(
            code="DATA_PIPELINE_REFUSED",
            message=f"LLaMA-Factory would load tokenized_path {path}, and datasets' "
            f"load_from_disk refused: {one_line(exc)}",
            fix_as="tokenized",
            key="tokenized_path",
        )
        return
    launch.tokenized_max_id = _max_token_id(saved)
    launch.tokenized_vocab = len(tokenizer)
    if hasattr(saved, "items"):  # a DatasetDict, as get_dataset saves it
        launch.run.rows = {"train": len(saved["train"]) if "train" in saved else 0}
        launch.run.rows["eval"] = sum(len(d) for name, d in saved.items() if name.startswith("validation"))
    else:
        launch.run.rows = {"train": len(saved), "eval": 0}
    launch.train_rows = launch.run.rows["train"]
    launch.run.skip("the dataset's rows", f"LLaMA-Factory loads the tokenized data in {path} instead of the dataset")


def strided(read: int, rows: int) -> list[int]:
    """``read`` row indices spread evenly over the first ``rows`` (0 among them), in the file's order."""
    return [i * rows // read for i in range(read)]


def _strided_rows(patches: Patches, cap: int, user_max_samples: int | None) -> None:
    """Where the dry run reads fewer rows of a dataset than the run trains on, a sample spread over all of them
    instead of the first ones: a file whose later rows are longer than its first made the tokens 3.5% short
    (issue 50). LLaMA-Factory truncates each dataset with ``dataset.select(range(max_samples))`` (loader.py
    ``_load_single_dataset``, pinned by a test); that one call takes the strided indices over the rows the run
    reads (the user's own max_samples, if any, keeps the first rows: those are the run's)."""
    from datasets import Dataset

    select = Dataset.select

    def strided_select(self: Dataset, indices: Any, *args: Any, **kwargs: Any) -> Dataset:
        whole = isinstance(indices, range) and indices.start == 0 and indices.step == 1
        if whole and len(indices) == min(int(cap), len(self)):
            rows = len(self) if user_max_samples is None else min(len(self), int(user_max_samples))
            if rows > len(indices):
                indices = strided(len(indices), rows)
        return select(self, indices, *args, **kwargs)

    patches.setattr(Dataset, "select", strided_select)


class _RecordingCap(int):
    """LLaMA-Factory's ``max_samples`` for the dry run, noting each dataset's full row count.

    loader.py ``_load_single_dataset``: ``max_samples = min(data_args.max_samples, len(dataset))``
    (pinned by a test). ``min`` compares ``len(dataset) < max_samples``; for an ``int`` subclass on the
    right, Python calls its reflected ``__gt__`` first, which is where the full count is seen.
    """

    def __new__(cls, value: int, spy: _SplitSpy) -> _RecordingCap:
        cap = super().__new__(cls, value)
        cap.spy = spy
        return cap

    def __gt__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, _RecordingCap):
            self.spy.seen.append(other)
        return int(self) > other


class _SplitSpy:
    """Stands in for loader.py's ``split_dataset``: the full-size split first, then the capped one."""

    def __init__(self, launch: Launch, streaming: bool) -> None:
        self.launch = launch
        self.streaming = streaming
        self.seen: list[int] = []  # full row counts, one per dataset loaded, in LLaMA-Factory's order
        self.cap = 0  # the dry run's max_samples: the rows read of each dataset at most
        self.merged_rows = 0  # the processed rows split_dataset was given (the datasets' together)
        self.train_positions: list[int] | None = None  # where each train row sits among them (_positions)
        self.capped = False
        self.full: dict[str, int] = {}
        self.dry: dict[str, int] = {}
        self.error: str | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import llamafactory.data.loader as loader

        original = loader.split_dataset

        def split_dataset(dataset, eval_dataset, data_args, seed):
            if not self.streaming:
                self.full_split(original, dataset, eval_dataset, data_args, seed)
            try:
                train, evals = original(dataset, eval_dataset, data_args, seed)
            except Exception as exc:
                if self.error is None:
                    self.refused(exc, _length(dataset) + _length(eval_dataset))
                raise
            self.dry = {"train": _length(train.get("train")), "eval": sum(_length(d) for d in evals.values())}
            self.merged_rows, self.train_positions = _length(dataset), _positions(dataset, train.get("train"))
            return train, evals

        with Patches() as patches:
            patches.setattr(loader, "split_dataset", split_dataset)
            yield

    def run_rows(self) -> list[int]:
        """The rows the run trains on of each dataset loaded: its full count, or the user's max_samples."""
        user = self.launch.user_max_samples
        return [min(n, user) if user is not None else n for n in self.seen]

    def refused(self, exc: Exception, rows: int) -> None:
        self.error = one_line(exc)
        self.launch.run.error(
            code="DATA_SPLIT_REFUSED",
            message=f"On the full data ({rows} rows), LLaMA-Factory's split_dataset (datasets' train_test_split) "
            f"refused: {self.error}",
            key="val_size",
            remedy={"val_size": 0.1},
        )

    def full_split(self, original, dataset, eval_dataset, data_args, seed) -> None:
        """LLaMA-Factory's merge and split on index-only datasets of the full sizes (datasets' own calls)."""
        from llamafactory.data.data_utils import merge_dataset

        from datasets import Dataset

        launch = self.launch
        cap = int(data_args.max_samples)
        n_train = len(data_args.dataset or [])
        if len(self.seen) != n_train + len(data_args.eval_dataset or []):
            launch.run.skip("the split on the full rows", "LLaMA-Factory's max_samples line changed (loader.py)")
            return
        counts = self.run_rows()
        self.capped = any(n > cap for n in counts)
        if not self.capped:
            return  # the real split below is the full split
        index = [Dataset.from_dict({"i": range(n)}) for n in counts]
        train_parts, eval_parts = index[:n_train], index[n_train:]
        try:
            merged = merge_dataset(train_parts, data_args, seed=seed) if train_parts else None
            merged_eval = None
            if eval_parts:
                if data_args.eval_on_each_dataset:
                    merged_eval = dict(zip(data_args.eval_dataset, eval_parts, strict=True))
                else:
                    merged_eval = merge_dataset(eval_parts, data_args, seed=seed)
            train, evals = original(merged, merged_eval, data_args, seed)
        except Exception as exc:
            self.refused(exc, sum(counts))
            raise
        self.full = {"train": _length(train.get("train")), "eval": sum(_length(d) for d in evals.values())}
        if data_args.val_size > 1e-6 and self.full["train"]:
            # Keep the capped split's share: an integer val_size larger than the capped rows would be a
            # refusal of the dry run's own making.
            data_args.val_size = self.full["eval"] / (self.full["train"] + self.full["eval"])


def _length(dataset: Any) -> int:
    if dataset is None:
        return 0
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset
        return 0


def _max_token_id(saved: Any) -> int:
    """The largest id in any ``*input_ids`` column of a saved (tokenized) dataset."""
    import pyarrow.compute as pc

    parts = saved.values() if hasattr(saved, "values") else [saved]
    best = -1
    for part in parts:
        table = part.with_format("arrow")[:]
        for name in table.column_names:
            if name.endswith("input_ids"):
                column = pc.list_flatten(table[name])
                if len(column):
                    best = max(best, pc.max(column).as_py())
    return best
