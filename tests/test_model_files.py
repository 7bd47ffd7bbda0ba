"""A model that is not here (lf/model_files.py): with a Hub reachable, the real huggingface_hub client fetches
what the dry run reads (config, tokenizer) and no weight, into the user's cache, and the forecast is made; a
gated repo without access is said as such with how to log in. The Hub is a stand-in on 127.0.0.1
(tests/hub_server.py) serving a repo of Llama-3-8B's shape with the tiny tokenizer and weight files that must
never be fetched."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from llamafactory_rocm.lf.model_files import FETCHED
from tests.conftest import offline_env, run_cli, tiny_train_config
from tests.hub_server import serving
from tests.test_planning import llama3_8b_folder

REPO = "acme/llama3-8b-shape"
WEIGHTS = ("model-00001-of-00004.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def _repo(tiny_model: Path, folder: Path) -> Path:
    llama3_8b_folder(tiny_model, folder)
    for name in WEIGHTS:  # what a real repo holds beside the config: never to be fetched
        (folder / name).write_bytes(b"\0" * 4096)
    return folder


def _check(tmp_path: Path, hub_url: str, model: str, *extra: str) -> tuple[int, str, dict]:
    config = tiny_train_config(Path("unused"), tmp_path / "out", model_name_or_path=model, max_samples=32)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = offline_env(tmp_path, HF_ENDPOINT=hub_url)
    env.pop("HF_HUB_OFFLINE")  # the Hub may be reached
    done = run_cli(["check", str(config_file), "--gpu", "mi300x", "--forecast", *extra], tmp_path, env)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    env["HF_HOME"] = str(tmp_path / "hf-json")  # an empty cache again: the first check filled the other
    as_json = run_cli(["check", str(config_file), "--gpu", "mi300x", "--forecast", "--json"], tmp_path, env)
    return done.returncode, done.stdout, json.loads(as_json.stdout)


def test_a_reachable_hub_gives_the_config_and_tokenizer_and_no_weight(tiny_model, tmp_path):
    repo = _repo(tiny_model, tmp_path / "repo")
    with serving({REPO: repo}) as hub:
        code, text, report = _check(tmp_path, hub.url, REPO)
    assert code == 0, text[-3000:]
    served = {name.removeprefix(REPO + "/") for name in hub.served}
    assert len(hub.served) == 2 * len(served)  # each check fetched each file once, into its own cache
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= served, served
    assert not served & set(WEIGHTS) and served <= set(FETCHED), served
    cached = {p.name for p in (tmp_path / "hf" / "hub").rglob("*") if p.is_file() or p.is_symlink()}
    assert not cached & set(WEIGHTS), cached  # the user's cache holds no weight either
    forecast = report["forecast"]
    assert forecast["model_files"]["how"] == "fetched" and forecast["work"]["steps"] > 0 and forecast["run_flops"]
    size = sum((repo / name).stat().st_size for name in served)
    assert forecast["model_files"]["bytes"] == size
    assert "fetched from the Hugging Face Hub into its cache, no weights: config.json" in text, text[-3000:]
    assert text.splitlines()[-1] == "ok: ready to launch"


def test_a_gated_repo_says_so_and_how_to_log_in(tiny_model, tmp_path):
    repo = _repo(tiny_model, tmp_path / "repo")
    with serving({REPO: repo}, gated=frozenset({REPO})) as hub:
        code, text, report = _check(tmp_path, hub.url, REPO)
    assert code == 0 and not hub.served  # planned for mi300x: the target's own token may have access
    assert f"{REPO} is gated on the Hugging Face Hub" in text and "hf auth login" in text, text[-3000:]
    assert report["forecast"]["made"] is False  # acme's repo has no bundled shape: nothing stands in


def test_no_answer_from_the_hub_is_said_as_such(tmp_path):
    _, text, _ = _check(tmp_path, "http://127.0.0.1:9", REPO)  # nothing listens on the discard port
    assert "the Hugging Face Hub did not answer" in text, text[-3000:]
