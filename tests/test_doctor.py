"""``doctor`` on recorded machines: what a person sees before renting time on them."""

import json
import subprocess
import sys

import pytest

from llamafactory_rocm.check.doctor import FAIL, PASS, WARN, diagnose, has_fail
from tests.conftest import SNAPSHOTS, load_snapshot


def statuses(name: str) -> dict[str, str]:
    return {f"{ln.topic}:{ln.code or ''}": ln.status for ln in diagnose(load_snapshot(name))}


def codes(name: str, status: str) -> set[str]:
    return {ln.code for ln in diagnose(load_snapshot(name)) if ln.status == status and ln.code}


@pytest.mark.parametrize("name", ["mi300x", "rx7900xtx", "w7900", "mi250x"])
def test_ready_rocm_machines_have_no_fail(name):
    lines = diagnose(load_snapshot(name))
    assert not has_fail(lines), [ln for ln in lines if ln.status == FAIL]
    assert any(ln.topic == "torch" and "ROCm build" in ln.detail for ln in lines)
    assert any(ln.topic == "/dev/kfd" and ln.status == PASS for ln in lines)


def test_wrong_wheel_fails_with_the_install_fix():
    assert codes("wrong_wheel_mi300x", FAIL) == {"TORCH_NOT_ROCM"}
    assert not any("NVIDIA machine" in ln.detail for ln in diagnose(load_snapshot("wrong_wheel_mi300x")))


def test_mi50_fails_because_the_wheel_lacks_gfx906():
    assert "ARCH_NOT_IN_TORCH" in codes("mi50", FAIL)


def test_cpu_only_says_so_plainly_and_does_not_fail():
    lines = diagnose(load_snapshot("cpu_only"))
    assert not has_fail(lines)
    (torch_line,) = [ln for ln in lines if ln.topic == "torch"]
    assert torch_line.status == WARN and "no GPU on this machine" in torch_line.detail


def test_cuda_build_is_reported_and_not_judged():
    lines = diagnose(load_snapshot("cuda_h200"))
    assert not has_fail(lines) and not [ln for ln in lines if ln.status == WARN]


def test_multi_gpu_mi300x_lists_rccl_variables_and_the_rocm_6_allocator_warning():
    lines = diagnose(load_snapshot("mi300x_8gpu"))
    assert {"NCCL_MIN_NCHANNELS", "GPU_MAX_HW_QUEUES"} <= {ln.topic for ln in lines}
    assert "EXPANDABLE_SEGMENTS_OLD_ROCM" in {ln.code for ln in lines if ln.status == WARN}


def test_no_render_group_access_fails_with_the_group_fix():
    snap = load_snapshot("rx7900xtx")
    snap = snap.model_copy(update={"access": snap.access.model_copy(update={"kfd_accessible": False})})
    (line,) = [ln for ln in diagnose(snap) if ln.topic == "/dev/kfd"]
    assert line.status == FAIL and "usermod -aG render,video" in line.fix


@pytest.mark.parametrize(("name", "code"), [("mi300x", 0), ("cpu_only", 0), ("wrong_wheel_mi300x", 1)])
def test_cli_exit_codes_and_json(name, code, tmp_path):
    snapshot = str(SNAPSHOTS / f"{name}.json")
    result = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "doctor", "--json", "--snapshot", snapshot],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == code
    report = json.loads(result.stdout)
    assert report["ok"] is (code == 0)
    assert all(ln["status"] in {"pass", "warn", "fail"} for ln in report["lines"])


def test_doctor_runs_on_this_machine(tmp_path):
    out = tmp_path / "me.json"
    result = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "doctor", "--save-snapshot", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr
    assert "doctor (probe)" in result.stdout and out.is_file()


def test_save_snapshot_never_replaces_a_file(tmp_path):
    out = tmp_path / "mine.json"
    out.write_text("my notes")
    snapshot = str(SNAPSHOTS / "mi300x.json")
    command = ["doctor", "--snapshot", snapshot, "--save-snapshot", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", *command],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and out.read_text() == "my notes"
    said = f"{out} exists: give --save-snapshot a new file name (nothing was written)."
    assert result.stderr.strip() == f"llamafactory-rocm doctor: {said}"


def test_doctor_json_holds_no_kernel_command_line_hostname_or_home(tmp_path):
    """doctor --json is posted in public: only iommu_pt is kept of /proc/cmdline (issue 17, privacy)."""
    import socket
    from pathlib import Path

    result = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "doctor", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert "kernel_cmdline" not in report["snapshot"] and report["snapshot"]["iommu_pt"] in (True, False, None)
    try:
        cmdline = Path("/proc/cmdline").read_text().strip()
    except OSError:
        cmdline = ""
    # The whole line, and each of its distinctive words (root=..., BOOT_IMAGE=..., paths).
    if cmdline:
        assert cmdline not in result.stdout
    for word in cmdline.split():
        if ("=" in word or "/" in word) and word != "iommu=pt" and len(word) > 5:
            assert word not in result.stdout, word
    values = _strings(report)
    host = socket.gethostname()
    assert host not in values
    home = str(Path.home())
    if len(home) > 1:
        assert not [v for v in values if home in v]


def _strings(node: object) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, dict):
        return set().union(*(_strings(v) for v in node.values()), *(_strings(k) for k in node)) if node else set()
    if isinstance(node, list):
        return set().union(*(_strings(v) for v in node)) if node else set()
    return set()


def test_the_probe_keeps_only_whether_iommu_pt_is_set(tmp_path):
    from llamafactory_rocm.machine.probe import read_iommu_pt

    line = tmp_path / "cmdline"
    line.write_text("BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=1b2c3d4e ro iommu=pt amd_iommu=on\n")
    assert read_iommu_pt(line) is True
    line.write_text("BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=1b2c3d4e ro quiet iommu=ptx\n")
    assert read_iommu_pt(line) is False
    assert read_iommu_pt(tmp_path / "absent") is None


def lines_by_topic(name: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for ln in diagnose(load_snapshot(name)):
        found.setdefault(ln.topic, []).append(ln)
    return found


def test_igpu_beside_the_card_is_one_fail_with_the_exact_variable_and_nothing_about_the_igpu_else():
    lines = diagnose(load_snapshot("rx7900xtx_with_igpu"))
    assert [ln.code for ln in lines if ln.status == FAIL] == ["IGPU_VISIBLE"]
    (igpu,) = [ln for ln in lines if ln.code == "IGPU_VISIBLE"]
    assert igpu.topic == "integrated GPU" and "export HIP_VISIBLE_DEVICES=1" in igpu.fix
    assert not any("gfx1036" in ln.detail for ln in lines if ln.code not in (None, "IGPU_VISIBLE"))
    gpu0 = lines_by_topic("rx7900xtx_with_igpu")["gpu 0"][0]
    assert "left out of the plan" in gpu0.detail
    assert "NCCL_MIN_NCHANNELS" not in {ln.topic for ln in lines}  # one card: no multi-GPU lines


def test_wsl2_does_not_fail_on_dev_kfd_and_says_what_applies():
    topics = lines_by_topic("wsl2_rx7900xtx")
    assert not has_fail(diagnose(load_snapshot("wsl2_rx7900xtx")))
    (kfd,) = topics["/dev/kfd"]
    assert kfd.status == PASS and "/dev/dxg" in kfd.detail
    (dxg,) = topics["/dev/dxg"]
    assert dxg.code == "WSL2_DXG" and "HSA_ENABLE_DXG_DETECTION=1" in dxg.fix


def test_disagreeing_visibility_variables_have_their_topic():
    (line,) = lines_by_topic("rx7900xtx_visibility_conflict")["visible devices"]
    assert line.status == WARN and line.code == "VISIBLE_DEVICES_CONFLICT"
    assert "ROCR_VISIBLE_DEVICES=1" in line.fix


def test_hip_vs_system_rocm_and_the_jit_toolchain():
    topics = lines_by_topic("rx7900xtx_rocm_mismatch")
    assert [ln.code for ln in topics["system ROCm"] if ln.code] == ["ROCM_VERSION_MISMATCH"]
    assert any(ln.status == PASS and "7.1.0-38" in ln.detail for ln in topics["system ROCm"])
    (tools,) = topics["JIT toolchain"]
    assert tools.status == PASS and "ninja, hipcc and ROCM_HOME found" in tools.detail


def test_doctor_says_which_rocm_layout_it_read():
    (line,) = lines_by_topic("mi300x_therock_rocm10")["system ROCm"]  # no mismatch claimed
    assert line.status == PASS and line.code is None
    assert "10.0.0 (/opt/rocm/core/.info/version, therock layout)" in line.detail
    assert "majors not compared" in line.detail  # HIP 7.13 beside ROCm 10: unsettled
    topics = lines_by_topic("rx7900xtx_therock_rocm10_mismatch")
    assert [ln.code for ln in topics["system ROCm"] if ln.code] == ["ROCM_VERSION_MISMATCH"]
    snap = load_snapshot("mi300x_therock_rocm10")
    for update, said in (
        ({"system_rocm": None, "system_rocm_file": None, "system_rocm_layout": "unknown"}, "version not read"),
        ({"system_rocm": None, "system_rocm_file": None, "system_rocm_installs": ["core-7.14", "core-10.0"]},
         "several installs (core-7.14, core-10.0)"),
    ):  # fmt: skip
        unread = snap.model_copy(update={"host": snap.host.model_copy(update=update)})
        (line,) = [ln for ln in diagnose(unread) if ln.topic == "system ROCm"]
        assert line.status == PASS and said in line.detail and line.code is None


def test_jit_toolchain_missing_warns_where_deepspeed_is_installed():
    snap = load_snapshot("rx7900xtx_rocm_mismatch")
    snap = snap.model_copy(update={"host": snap.host.model_copy(update={"ninja": False})})
    (tools,) = [ln for ln in diagnose(snap) if ln.topic == "JIT toolchain"]
    assert tools.status == WARN and "ninja missing" in tools.detail and "pip install ninja" in tools.fix


def test_strix_halo_shows_unified_memory_and_the_page_fault_topic():
    topics = lines_by_topic("strixhalo")
    assert "carve-out 0.5 GiB + GTT 128.0 GiB" in topics["gpu 0"][0].detail
    assert topics["unified memory"][0].status == PASS
    (faults,) = topics["page faults"]
    assert faults.status == WARN and "PYTORCH_NO_HIP_MEMORY_CACHING=1" in faults.fix


def test_an_override_on_a_natively_supported_card_is_a_warning_topic():
    (line,) = lines_by_topic("rx7800xt_override")["HSA_OVERRIDE_GFX_VERSION"]
    assert line.status == WARN and line.code == "HSA_OVERRIDE_NOT_NEEDED"


def test_bitsandbytes_floor_is_each_archs_catalogue_entry():
    snap = load_snapshot("rx7900xtx")
    snap = snap.model_copy(update={"packages": {**snap.packages, "bitsandbytes": "0.48.2"}})
    (line,) = [ln for ln in diagnose(snap) if ln.topic == "bitsandbytes"]
    assert line.status == WARN and "no QLoRA kernels for gfx1100" in line.detail
    assert "gfx1100: >= 0.49" in line.fix  # archs.json bitsandbytes_min_version (docs/rocm-facts.md#f9)
