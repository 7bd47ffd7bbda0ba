"""The named GPU must be the one here; what lies in output_dir is said before a run writes over it (another
experiment's checkpoints are never rotated away); multi-GPU notices."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.target import planned_snapshot, resolve_target
from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import multi_gpu, outputs, target
from llamafactory_rocm.rules.base import Context, Target
from tests.conftest import make_ctx, offline_env, tiny_train_config


def test_preset_file_name_names_its_gpu():
    found = resolve_target(config_path="presets/mi300x_llama3_lora.yaml")
    assert (found.arch, found.alias) == ("gfx942", "mi300x")
    assert resolve_target(config_path="my_run.yaml") is None


def test_gpu_named_in_the_file_but_another_present_is_an_error():
    ctx = make_ctx("rx7900xtx", target=resolve_target(config_path="mi300x_llama3_lora.yaml"))
    (finding,) = target.check_target({}, {}, ctx).findings
    assert finding.code == "TARGET_MISMATCH" and finding.level is Level.ERROR
    assert "gfx1100" in finding.message


def test_matching_gpu_passes():
    ctx = make_ctx("w7900", target=Target(arch="gfx1100", alias="rx7900xtx", named_by="--gpu"))
    assert target.check_target({}, {}, ctx).findings == []


def test_planned_target_on_a_laptop_is_information():
    t = Target(arch="gfx942", alias="mi300x", named_by="--gpu")
    ctx = make_ctx("cpu_only", target=t)
    ctx = Context(snapshot=planned_snapshot(t, {}), catalogue=ctx.catalogue, known_keys=ctx.known_keys, target=t)
    assert [f.code for f in target.check_target({}, {}, ctx).findings] == ["PLANNED_TARGET"]
    assert ctx.snapshot.devices[0].total_memory_gib == 192


def test_training_a_gpu_preset_on_cpu_warns():
    ctx = make_ctx("cpu_only", target=Target(arch="gfx942", alias="mi300x", named_by="file name x"))
    assert [f.code for f in target.check_target({}, {}, ctx).findings] == ["TARGET_ABSENT"]


def test_overwrite_output_dir_over_existing_checkpoints_is_a_warning_naming_them():
    ctx = make_ctx("mi300x", existing_outputs=("checkpoint-100", "adapter_model.safetensors"))
    (finding,) = outputs.protect_existing_checkpoints({"overwrite_output_dir": True}, {}, ctx).findings
    assert (finding.code, finding.level) == ("CHECKPOINT_OVERWRITE", Level.WARNING)
    assert "checkpoint-100, adapter_model.safetensors" in finding.message


def test_resuming_without_overwrite_or_rotation_is_fine():
    ctx = make_ctx("mi300x", existing_outputs=("checkpoint-100",))
    assert outputs.protect_existing_checkpoints({"do_train": True}, {}, ctx).findings == []


def _checkpoint(folder: Path, step: int, rank: int, base: str = "tiny") -> None:
    ckpt = folder / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    adapter = {"peft_type": "LORA", "r": rank, "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": base}
    (ckpt / "adapter_config.json").write_text(json.dumps(adapter))


@pytest.mark.parametrize(
    ("others", "level"),
    [
        ([], Level.INFO),  # the resumed run's own checkpoints only
        ([(1, 8, "tiny")], Level.INFO),
        ([(1, 16, "tiny")], Level.ERROR),  # another adapter shape
        ([(1, 8, "another-model")], Level.ERROR),  # another base model
    ],
)
def test_save_total_limit_rotates_the_resumed_runs_own_checkpoints_and_refuses_anothers(tmp_path, others, level):
    out = tmp_path / "out"
    _checkpoint(out, 2, 8)
    for step, rank, base in others:
        _checkpoint(out, step, rank, base)
    names = tuple(sorted(p.name for p in out.iterdir()))
    ctx = _with(make_ctx("cpu_only", existing_outputs=names), resume_checkpoint="checkpoint-2")
    config = {"do_train": True, "output_dir": str(out), "save_total_limit": 1}
    (finding,) = outputs.protect_existing_checkpoints(config, {}, ctx).findings
    assert (finding.code, finding.level) == ("CHECKPOINT_ROTATION", level)
    if level is Level.ERROR:
        assert "would delete checkpoint-1 in" in finding.message
    # transformers' rotate_checkpoints does nothing for save_total_limit <= 0; overwrite_output_dir is its own
    assert outputs.protect_existing_checkpoints({**config, "save_total_limit": 0}, {}, ctx).findings == []
    overwrite = outputs.protect_existing_checkpoints({**config, "overwrite_output_dir": True}, {}, ctx)
    assert [f.code for f in overwrite.findings] == ["CHECKPOINT_OVERWRITE"]


def test_a_run_that_never_resumes_is_refused_rotation_among_old_checkpoints(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 2, 8)
    ctx = _with(make_ctx("cpu_only", existing_outputs=("checkpoint-2",)), resume_checkpoint="checkpoint-2")
    config = {"do_train": True, "output_dir": str(out), "save_total_limit": 1, "stage": "rm", "finetuning_type": "full"}
    (finding,) = outputs.protect_existing_checkpoints(config, {}, ctx).findings
    assert (finding.code, finding.level) == ("CHECKPOINT_ROTATION", Level.ERROR)


def test_rotation_order_is_transformers_own(tmp_path):
    """Oracle: transformers' rotate_checkpoints deletes the checkpoints other_experiments lists first."""
    from transformers.trainer_utils import rotate_checkpoints

    from llamafactory_rocm.lf.outputs import other_experiments

    out = tmp_path / "out"
    for step, rank in ((10, 16), (9, 16), (100, 8)):
        _checkpoint(out, step, rank)
    assert other_experiments(out, out / "checkpoint-100") == ["checkpoint-9", "checkpoint-10"]
    rotate_checkpoints(str(out), save_total_limit=1)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-100"]  # both gone: why rotation is refused


def test_multi_gpu_notices_on_mi300x_without_iommu_pt_and_on_rdna3():
    assert multi_gpu.multi_gpu_notices({}, {}, make_ctx("mi300x")).findings == []  # one GPU
    eight = multi_gpu.multi_gpu_notices({}, {}, make_ctx("mi300x_8gpu"))
    assert "MI300X_PARTIAL_NODE" not in [f.code for f in eight.findings]
    assert "EXPANDABLE_SEGMENTS_OLD_ROCM" in [f.code for f in eight.findings]  # ROCm 6.4 < 7.0
    ctx = make_ctx("mi300x_8gpu")
    four = ctx.snapshot.model_copy(update={"devices": ctx.snapshot.devices[:4], "iommu_pt": False})
    ctx = Context(snapshot=four, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    codes = [f.code for f in multi_gpu.multi_gpu_notices({}, {"OPTIM_TORCH": "0"}, ctx).findings]
    assert codes == ["IOMMU_PT_MISSING", "MI300X_PARTIAL_NODE"]


def test_iommu_pt_unknown_is_not_reported_as_missing():
    ctx = make_ctx("mi300x_8gpu")
    unknown = ctx.snapshot.model_copy(update={"iommu_pt": None})
    ctx = Context(snapshot=unknown, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    assert "IOMMU_PT_MISSING" not in [f.code for f in multi_gpu.multi_gpu_notices({}, {}, ctx).findings]


def test_a_copied_preset_keeps_its_target_by_its_target_line(tmp_path):
    from llamafactory_rocm import presets

    copy = tmp_path / "my_run.yaml"  # the file name no longer names a GPU
    copy.write_bytes(presets.path("mi300x_llama3_lora").read_bytes())
    found = resolve_target(config_path=copy)
    assert (found.arch, found.alias) == ("gfx942", "mi300x")
    assert found.named_by == "the target line of my_run.yaml"


def test_a_target_line_pins_the_run_a_file_name_only_suggests_it():
    pinned = make_ctx("cpu_only", target=Target("gfx942", "mi300x", "the target line of my_run.yaml"))
    (finding,) = target.check_target({}, {}, pinned).findings
    assert (finding.code, finding.level) == ("TARGET_ABSENT", Level.ERROR)
    assert "--accept TARGET_ABSENT" in finding.fix
    guessed = make_ctx("cpu_only", target=Target("gfx942", "mi300x", "file name mi300x_x.yaml"))
    (finding,) = target.check_target({}, {}, guessed).findings
    assert (finding.code, finding.level) == ("TARGET_ABSENT", Level.WARNING)


def _with(ctx: Context, **changes: object) -> Context:
    from dataclasses import replace

    return replace(ctx, **changes)


def test_the_stages_that_never_resume_are_llamafactorys_line():
    import inspect

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams.parser import get_train_args
    source = inspect.getsource(get_train_args)
    line = 'if finetuning_args.stage in ["rm", "ppo"] and finetuning_args.finetuning_type in ["full", "freeze"]:'
    assert line in source and "can_resume_from_checkpoint = False" in source


def test_the_resume_checkpoint_is_transformers_own_choice(tmp_path):
    from llamafactory_rocm.lf.outputs import resume_checkpoint

    assert resume_checkpoint(tmp_path / "absent") is None
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"w")
    assert resume_checkpoint(tmp_path) == "checkpoint-2"
    (tmp_path / "checkpoint-10").mkdir()  # numeric order, not text order
    assert resume_checkpoint(tmp_path) == "checkpoint-10"


def test_a_training_run_gets_the_loss_plot_unless_the_config_says():
    ctx = _with(make_ctx("cpu_only"), installed=frozenset({"matplotlib"}))
    step = outputs.plot_the_loss({"do_train": True}, {}, ctx)
    assert step.config["plot_loss"] is True and [f.code for f in step.findings] == ["PLOT_LOSS_ADDED"]
    for config in ({"do_train": True, "plot_loss": False}, {"do_train": False}):
        assert outputs.plot_the_loss(config, {}, ctx).findings == []
    without = _with(ctx, installed=frozenset())
    assert outputs.plot_the_loss({"do_train": True}, {}, without).findings == []


def test_the_default_output_dir_is_transformers_own():
    """transformers gives a run without output_dir this folder (TrainingArguments.__post_init__)."""
    from transformers import TrainingArguments

    from llamafactory_rocm.lf.schema import DEFAULT_OUTPUT_DIR, output_dir_of

    assert TrainingArguments().output_dir == DEFAULT_OUTPUT_DIR == output_dir_of({})
    assert output_dir_of({"output_dir": "saves/x"}) == "saves/x"


LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")


@pytest.mark.trainer
def test_a_crashed_run_with_save_total_limit_resumes_through_stock_llamafactory_cli_with_the_hook_on(
    tiny_model, tmp_path
):
    """Oracle: stock ``llamafactory-cli train`` (the hook on, the default) resumes and rotates, as LLaMA-Factory
    alone does. The first run stops after step 2 as a crash would (its final files removed, its checkpoints
    kept); the relaunch resumes from checkpoint-2 and the rotation deletes only that run's own checkpoints."""
    from llamafactory_rocm.check.run import check_config

    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, save_steps=1, save_total_limit=2, plot_loss=False)
    env = offline_env(tmp_path)

    def train(max_steps: int) -> subprocess.CompletedProcess:
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump({**config, "max_steps": max_steps}, sort_keys=False))
        return subprocess.run(
            [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )

    first = train(2)
    assert first.returncode == 0, first.stderr[-3000:]
    for path in out.iterdir():  # what a crash after the second save leaves: the checkpoints alone
        if not path.name.startswith("checkpoint-"):
            path.unlink() if path.is_file() else None
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-1", "checkpoint-2"]
    state_file = out / "checkpoint-2" / "trainer_state.json"  # marked: a resumed trainer carries its history on
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "log_history": [*state["log_history"], {"note": "first run"}]}))
    report = check_config({**config, "max_steps": 4})
    rotation = [f for f in report.findings if f.code == "CHECKPOINT_ROTATION"]
    assert report.ok and [f.level for f in rotation] == [Level.INFO], report.findings
    relaunch = train(4)
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-3", "checkpoint-4"]
    final = json.loads((out / "trainer_state.json").read_text())
    assert final["global_step"] == 4 and {"note": "first run"} in final["log_history"]  # resumed, not restarted
