"""Shared fixtures: recorded machine snapshots, the rule context, and a tiny local model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamafactory_rocm.lf.schema import train_keys
from llamafactory_rocm.machine.catalogue import load_catalogue
from llamafactory_rocm.machine.snapshot import Snapshot
from llamafactory_rocm.resources import datasets_dir
from llamafactory_rocm.rules import Context, Target

# No test reaches the real Hugging Face Hub. Where a test lets the check go online (HF_HUB_OFFLINE unset, as a
# user's laptop is), the Hub is this closed local port, which refuses at once; tests/hub_server.py serves the
# tests that need a Hub. Set for this process (huggingface_hub read HF_ENDPOINT at import) and its children.
CLOSED_HUB = "http://127.0.0.1:9"


def _no_real_hub() -> None:
    import huggingface_hub.constants as hub

    os.environ.setdefault("HF_ENDPOINT", CLOSED_HUB)
    if hub.ENDPOINT == hub._HF_DEFAULT_ENDPOINT:
        hub.ENDPOINT = os.environ["HF_ENDPOINT"]


_no_real_hub()

SNAPSHOTS = Path(__file__).parent / "snapshots"
ROCM_SNAPSHOTS = ("mi300x", "mi300x_8gpu", "mi250x", "rx7900xtx", "w7900", "mi100", "mi50", "rx7800xt")
ALL_SNAPSHOTS = tuple(sorted(p.stem for p in SNAPSHOTS.glob("*.json")))


def load_snapshot(name: str) -> Snapshot:
    return Snapshot.load(SNAPSHOTS / f"{name}.json")


def make_ctx(name: str, target: Target | None = None, existing_outputs: tuple[str, ...] = ()) -> Context:
    return Context(
        snapshot=load_snapshot(name),
        catalogue=load_catalogue(),
        known_keys=train_keys(),
        target=target,
        existing_outputs=existing_outputs,
    )


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment a training subprocess gets: no hub, caches inside tmp_path."""
    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_DISABLED="true",
        # One thread per training process: runs go side by side on a 2-core machine, where the demo's
        # run took 7.7 s with one thread and 161 s with two while other jobs held the cores.
        OMP_NUM_THREADS="1",
    )
    # Not inherited from this process: a rank's variables, and the verbosity an in-process run_exp test set
    # here (quiet_by_default writes LLAMAFACTORY_VERBOSITY into os.environ, as it does for torchrun's ranks).
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FORCE_TORCHRUN", "LLAMAFACTORY_ROCM_CHECKED",
                "LLAMAFACTORY_VERBOSITY", "TRANSFORMERS_VERBOSITY"):  # fmt: skip
        env.pop(key, None)
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + tokenizer trained on the bundled QA data (built once per test session)."""
    from llamafactory_rocm.demo.tiny import build_tiny_model, texts_from_dataset

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    return build_tiny_model(out, texts_from_dataset(datasets_dir() / "amd_finetune_qa.json"))


def tiny_train_config(model: Path, output_dir: Path, **overrides: object) -> dict:
    """The demo's LoRA SFT config on the bundled data, made small enough to train in seconds on CPU."""
    from llamafactory_rocm.demo import demo_config

    config = demo_config(model, output_dir, max_steps=16)
    for blog_key in ("fp16", "compute_dtype", "backend"):  # tests add these back where they test them
        config.pop(blog_key)
    for demo_only in ("plot_loss", "include_num_input_tokens_seen"):  # the demo's extras cost each test time
        config.pop(demo_only)
    config.update(max_samples=64, cutoff_len=128, learning_rate=2.0e-2, logging_steps=1)
    config.update(overrides)
    return config
