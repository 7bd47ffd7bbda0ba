"""The named GPU must be the one here; existing checkpoints are never clobbered; multi-GPU notices."""

from llamafactory_rocm.check.target import planned_snapshot, resolve_target
from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import multi_gpu, outputs, target
from llamafactory_rocm.rules.base import Context, Target
from tests.conftest import make_ctx


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


def test_overwrite_output_dir_over_existing_checkpoints_is_refused():
    ctx = make_ctx("mi300x", existing_outputs=("checkpoint-100", "adapter_model.safetensors"))
    (finding,) = outputs.protect_existing_checkpoints({"overwrite_output_dir": True}, {}, ctx).findings
    assert finding.code == "CHECKPOINT_OVERWRITE" and finding.level is Level.ERROR


def test_save_total_limit_would_rotate_away_existing_checkpoints():
    ctx = make_ctx("mi300x", existing_outputs=("checkpoint-100",))
    (finding,) = outputs.protect_existing_checkpoints({"save_total_limit": 1}, {}, ctx).findings
    assert finding.code == "CHECKPOINT_ROTATION"


def test_resuming_without_overwrite_is_fine():
    ctx = make_ctx("mi300x", existing_outputs=("checkpoint-100",))
    assert outputs.protect_existing_checkpoints({}, {}, ctx).findings == []


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


def test_resuming_from_a_checkpoint_without_weights_is_refused():
    ctx = _with(make_ctx("cpu_only"), resume_checkpoint=("checkpoint-3", False))
    config = {"do_train": True, "output_dir": "out"}
    (finding,) = outputs.resume_only_from_whole_checkpoints(config, {}, ctx).findings
    assert (finding.code, finding.level) == ("CHECKPOINT_UNUSABLE", Level.ERROR)
    assert "checkpoint-3" in finding.message
    whole = _with(ctx, resume_checkpoint=("checkpoint-3", True))
    assert outputs.resume_only_from_whole_checkpoints(config, {}, whole).findings == []
    # no resume happens: overwriting, an explicit checkpoint, or no training
    for other in ({"overwrite_output_dir": True}, {"resume_from_checkpoint": "out/checkpoint-2"}, {"do_train": False}):
        assert outputs.resume_only_from_whole_checkpoints({**config, **other}, {}, ctx).findings == []
    # rm/ppo with full or freeze tuning never resume (LLaMA-Factory's can_resume_from_checkpoint)
    for stage, method in (("rm", "full"), ("ppo", "freeze")):
        never = {**config, "stage": stage, "finetuning_type": method}
        assert outputs.resume_only_from_whole_checkpoints(never, {}, ctx).findings == []
    assert outputs.resume_only_from_whole_checkpoints({**config, "stage": "rm"}, {}, ctx).findings  # lora resumes


def test_the_stages_that_never_resume_are_llamafactorys_line():
    import inspect

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams.parser import get_train_args
    source = inspect.getsource(get_train_args)
    line = 'if finetuning_args.stage in ["rm", "ppo"] and finetuning_args.finetuning_type in ["full", "freeze"]:'
    assert line in source and "can_resume_from_checkpoint = False" in source


def test_the_resume_checkpoint_is_transformers_own_choice_and_its_weights_are_looked_for(tmp_path):
    from llamafactory_rocm.check.outputs import resume_checkpoint

    assert resume_checkpoint(tmp_path / "absent") is None
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"w")
    # transformers' Trainer.train reads trainer_state.json of every checkpoint it resumes from
    assert resume_checkpoint(tmp_path) == ("checkpoint-2", False)
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert resume_checkpoint(tmp_path) == ("checkpoint-2", True)
    (tmp_path / "checkpoint-10").mkdir()  # numeric order, not text order
    assert resume_checkpoint(tmp_path) == ("checkpoint-10", False)


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
