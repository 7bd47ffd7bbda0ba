"""Every preset is plain LLaMA-Factory YAML its real parser accepts, fits its GPU, and trains scaled down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm import presets
from llamafactory_rocm.check.target import header_target
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.schema import train_keys
from llamafactory_rocm.machine.catalogue import load_catalogue
from llamafactory_rocm.preset_registry import load_registry
from llamafactory_rocm.resources import presets_dir
from tests.conftest import offline_env

NAMES = presets.names()
REQUIRED = {
    "mi300x_llama3_lora",
    "mi300x_llama3_lora_8gpu",
    "mi300x_llama3_lora_2node",
    "mi250_llama3_lora",
    "rx7900xtx_llama3_lora",
    "rx7800xt_llama3_qlora",
    "w7900_llama3_lora",
    "mi300x_qwen3_lora",
    "rx7900xtx_qwen3_lora",
    # issue 22
    "mi355x_llama3_lora",
    "r9700_llama3_lora",
    "rx9070xt_qwen3_4b_lora",
    "strixhalo_qwen3_lora",
}


def test_the_registry_is_the_folder_read_from_its_headers_and_covers_the_issue():
    assert set(NAMES) >= REQUIRED
    orders = [p.order for p in presets.entries()]
    assert orders == list(range(1, len(NAMES) + 1))  # each shipped preset has its place in the list
    for preset in presets.entries():
        assert preset.name.split("_")[0] == preset.gpu  # the GPU follows from the file name
        _, arch = load_catalogue().gpu(preset.gpu)
        assert header_target(presets.path(preset.name))["arch"] == arch.target  # the target line's arch is its GPU's
        for companion in preset.companions:
            assert (presets_dir() / companion).is_file()
    assert presets.entry("rx7800xt_llama3_qlora").method == "qlora"  # quantization_bit: 4 over LoRA
    assert presets.entry("mi300x_llama3_lora_8gpu").companions == ("deepspeed/ds_z2_config.json",)


def test_a_preset_without_its_listed_line_is_one_clear_line(tmp_path):
    text = presets.path("w7900_llama3_lora").read_text(encoding="utf-8").split("\n")
    (tmp_path / "w7800_llama3_lora.yaml").write_text("\n".join([text[0], *text[2:]]), encoding="utf-8")
    with pytest.raises(UsageError, match=r"w7800_llama3_lora.yaml lacks its header.*listed model=NAME -- DESCRIPTION"):
        load_registry(tmp_path)
    (tmp_path / "w7800_llama3_lora.yaml").write_text("\n".join(text), encoding="utf-8")
    (entry,) = load_registry(tmp_path)  # read again: the file changed
    assert (entry.name, entry.gpu, entry.after) == ("w7800_llama3_lora", "w7900", ())  # no after/ folder: none


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_plain_llamafactory_yaml_with_rocm_safe_choices(name):
    cfg = presets.raw(name)
    assert set(cfg) <= train_keys(), set(cfg) - train_keys()
    assert cfg["bf16"] is True and not cfg.get("fp16") and "tf32" not in cfg
    assert cfg["flash_attn"] == "sdpa" and "trust_remote_code" not in cfg
    header = presets.path(name).read_text().split("\n###")[0]
    assert "Why these values" in header and "GiB" in header


@pytest.mark.parametrize("name", NAMES)
def test_preset_header_states_the_estimate_the_estimator_gives(name):
    header = presets.path(name).read_text().split("\n###")[0]
    stated = [float(x) for x in re.findall(r"estimated (?:at )?(\d+(?:\.\d+)?) GiB peak", header)]
    stated += [float(x) for x in re.findall(r"Estimated peak at [^:]*: (\d+(?:\.\d+)?) GiB", header)]
    assert stated, "the header must state its estimated peak"
    assert presets.info(name).estimate.total_gib == pytest.approx(stated[0], abs=0.6)


@pytest.mark.parametrize("name", NAMES)
def test_check_for_its_own_gpu_reports_no_error_and_fits(name):
    gpu = presets.entry(name).gpu
    findings = presets.check(presets.load(name), gpu=gpu)
    assert [f.line() for f in findings if f.level is Level.ERROR] == []
    assert "MEMORY_OVER_BUDGET" not in [f.code for f in findings]
    assert "MEMORY_ESTIMATE" in [f.code for f in findings]


def test_check_on_the_wrong_gpu_with_a_recorded_machine_is_refused():
    from llamafactory_rocm.check.run import check_config
    from tests.conftest import load_snapshot

    report = check_config(presets.load("mi300x_llama3_lora"), snapshot=load_snapshot("rx7900xtx"),
                          config_path=presets.path("mi300x_llama3_lora"))  # fmt: skip
    assert "TARGET_MISMATCH" in [f.code for f in report.findings if f.level is Level.ERROR]


def test_load_makes_paths_absolute_and_keeps_types():
    cfg = presets.load("mi300x_llama3_lora_8gpu", overrides={"learning_rate": 5e-5})
    assert Path(cfg["dataset_dir"]).is_absolute() and (Path(cfg["dataset_dir"]) / "dataset_info.json").is_file()
    assert Path(cfg["deepspeed"]).is_absolute() and Path(cfg["deepspeed"]).is_file()
    assert cfg["learning_rate"] == 5e-5 and isinstance(cfg["per_device_train_batch_size"], int)
    ds = json.loads(Path(cfg["deepspeed"]).read_text())
    assert ds["zero_optimization"]["stage"] == 2


def test_unknown_name_lists_the_nearest():
    with pytest.raises(UsageError, match="nearest: mi300x_llama3_lora"):
        presets.path("mi300x_lama3")


def test_copy_never_overwrites_without_force(tmp_path):
    (written,) = presets.copy("w7900_llama3_lora", tmp_path)
    assert written == tmp_path / "w7900_llama3_lora.yaml"
    written.write_text("# my edits\n")
    with pytest.raises(UsageError, match="--force"):
        presets.copy("w7900_llama3_lora", tmp_path)
    assert written.read_text() == "# my edits\n"
    presets.copy("w7900_llama3_lora", tmp_path, force=True)
    assert written.read_text() == presets.path("w7900_llama3_lora").read_text()


def test_copy_brings_companion_files_and_refuses_a_missing_parent(tmp_path):
    written = presets.copy("mi300x_llama3_lora_8gpu", tmp_path / "run.yaml")
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["run.yaml", "deepspeed/ds_z2_config.json"]
    with pytest.raises(UsageError, match="does not exist"):
        presets.copy("mi300x_llama3_lora", tmp_path / "missing" / "x.yaml")
    with pytest.raises(UsageError, match="does not exist"):
        presets.copy("mi300x_llama3_lora", f"{tmp_path}/missing/")


def test_list_filters_by_gpu_arch():
    assert {i.entry.name for i in presets.list_presets("w7900")} == {
        "rx7900xtx_llama3_lora", "rx7900xtx_qwen3_lora", "w7900_llama3_lora"}  # fmt: skip
    with pytest.raises(UsageError, match="unknown GPU"):
        presets.list_presets("gtx1080")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamafactory_rocm.cli.main", "presets", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cli_list_json_has_gpu_arch_model_method_and_memory(tmp_path):
    result = cli("list", "--json", cwd=tmp_path)
    rows = json.loads(result.stdout)
    assert {r["name"] for r in rows} == set(NAMES)
    for row in rows:
        assert {"gpu", "arch", "model", "method", "estimated_peak_gib", "vram_gib"} <= set(row)
        assert 0 < row["estimated_peak_gib"] < 0.9 * row["vram_gib"]


def test_cli_show_copy_path_and_errors(tmp_path):
    shown = cli("show", "rx7900xtx_llama3_lora", cwd=tmp_path)
    assert shown.returncode == 0 and "gfx1100" in shown.stdout.splitlines()[0]
    assert yaml.safe_load(shown.stdout)["per_device_train_batch_size"] == 1
    assert Path(cli("path", "mi250_llama3_lora", cwd=tmp_path).stdout.strip()).is_file()
    assert cli("copy", "mi250_llama3_lora", "out.yaml", cwd=tmp_path).returncode == 0
    again = cli("copy", "mi250_llama3_lora", "out.yaml", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    unknown = cli("show", "mi300", cwd=tmp_path)
    assert unknown.returncode == 2 and "nearest" in unknown.stderr


# Every preset through LLaMA-Factory's real parser in one child process (its imports paid once; each
# get_train_args builds its own HfArgumentParser, so one parse cannot leak into the next).
PARSE_ALL = """
import json, sys
from llamafactory_rocm.lf.text_only import text_only_llamafactory
with text_only_llamafactory():
    from llamafactory.hparams import get_train_args
answers = {}
for name, cfg in json.loads(open(sys.argv[1]).read()).items():
    try:
        m, d, t, f, g = get_train_args(cfg)
        answers[name] = {'bf16': t.bf16, 'lora_rank': f.lora_rank, 'cutoff_len': d.cutoff_len}
    except BaseException as err:  # SystemExit included: the parser's refusal, in its words
        answers[name] = {'refused': f'{type(err).__name__}: {err}'}
print(json.dumps(answers))
"""


def runnable_here(cfg: dict) -> dict:
    """The preset without what needs packages this machine lacks."""
    cfg.pop("deepspeed", None)  # DeepSpeed (a ROCm build) is not installed here; its JSON is tested above
    cfg.pop("quantization_bit", None)  # bitsandbytes neither: QLoRA's own keys are checked by check --gpu
    cfg.pop("quantization_method", None)
    return cfg


def parser_config(name: str, tiny_model: Path, output_dir: Path) -> dict:
    overrides = {"model_name_or_path": str(tiny_model), "output_dir": str(output_dir)}
    return {**runnable_here(presets.load(name, overrides=overrides)), "use_cpu": True}  # bf16 on a CPU-only machine


@pytest.fixture(scope="module")
def parsed_presets(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("parsed_presets")
    configs = {name: parser_config(name, tiny_model, work / name) for name in NAMES}
    (work / "configs.json").write_text(json.dumps(configs))
    result = subprocess.run([sys.executable, "-c", PARSE_ALL, str(work / "configs.json")], env=offline_env(work),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_accepted_by_llamafactorys_real_parser(name, tiny_model, tmp_path, parsed_presets):
    cfg = parser_config(name, tiny_model, tmp_path / "o")
    assert parsed_presets[name] == {"bf16": True, "lora_rank": cfg["lora_rank"], "cutoff_len": cfg["cutoff_len"]}


@pytest.mark.trainer
@pytest.mark.parametrize("name", NAMES)
def test_preset_scaled_down_trains_through_the_real_trainer(name, tiny_model, tmp_path):
    from llamafactory_rocm.check.record import latest_record

    out = tmp_path / "out"
    scaled = {"model_name_or_path": str(tiny_model), "output_dir": str(out), "max_steps": 3, "cutoff_len": 128,
              "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "max_samples": 16,
              "preprocessing_num_workers": 1, "dataloader_num_workers": 0, "save_steps": 3,
              "logging_steps": 1}  # fmt: skip
    cfg = runnable_here(presets.load(name, overrides=scaled))
    path = tmp_path / f"{name}.yaml"  # keeps the preset's name: the check sees which GPU it is for
    path.write_text(yaml.safe_dump(cfg))
    llamafactory_cli = str(Path(sys.executable).parent / "llamafactory-cli")
    result = subprocess.run([llamafactory_cli, "train", str(path)], cwd=tmp_path, env=offline_env(tmp_path),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    record = latest_record(out)
    assert "TARGET_ABSENT" in {f["code"] for f in record["findings"]}


def test_deepspeed_file_beside_the_preset_is_found_from_any_working_directory(tmp_path, monkeypatch):
    from llamafactory_rocm.check.run import check_config

    monkeypatch.chdir(tmp_path)
    report = check_config(presets.raw("mi300x_llama3_lora_8gpu"), gpu="mi300x",
                          config_path=presets.path("mi300x_llama3_lora_8gpu"))  # fmt: skip
    assert "DEEPSPEED_PATH_RESOLVED" in [f.code for f in report.findings]
    assert Path(report.config["deepspeed"]).is_file()
    assert report.input_config["deepspeed"] == "deepspeed/ds_z2_config.json"
