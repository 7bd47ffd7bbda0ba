"""What the probe reads for unified memory, the iGPU and the environment faults, on fake sysfs/proc trees,
and how schema-2 snapshots load under schema 3. No AMD hardware here: the paths and formats are those the
published reports show (docs/rocm-facts.md#n9, #n13, #n14); the PCI matching was not tried on a machine."""

import json
import os

from llamafactory_rocm.machine.probe import (
    attach_drm_memory,
    pci_key,
    probe_drm,
    probe_host,
    read_meminfo,
    read_system_rocm,
    relevant_env,
)
from llamafactory_rocm.machine.snapshot import SNAPSHOT_SCHEMA_VERSION, Device, Snapshot, SystemRocm
from tests.conftest import SNAPSHOTS


def fake_card(root, n, pci, vram, gtt):
    target = root / "devices" / pci
    target.mkdir(parents=True)
    (target / "mem_info_vram_total").write_text(f"{vram}\n")
    (target / "mem_info_gtt_total").write_text(f"{gtt}\n")
    card = root / "drm" / f"card{n}"
    card.mkdir(parents=True)
    os.symlink(target, card / "device")


def test_drm_memory_per_card_by_pci_address(tmp_path):
    fake_card(tmp_path, 0, "0000:c3:00.0", 536870912, 137438953472)
    fake_card(tmp_path, 1, "0000:03:00.0", 25753026560, 33554432000)
    (tmp_path / "drm" / "card0-DP-1").mkdir()  # a connector, not a device
    cards = probe_drm(tmp_path / "drm")
    assert cards == {(0, 0xC3, 0): (536870912, 137438953472), (0, 3, 0): (25753026560, 33554432000)}
    assert pci_key("/sys/devices/pci0000:00/0000:00:08.1/0000:c3:00.0") == (0, 0xC3, 0)
    assert pci_key("/sys/devices/platform/foo") is None


def test_devices_get_their_cards_memory_and_unmatched_ones_stay_unknown():
    apu = Device(index=0, name="AMD Radeon 8060S", arch_name="gfx1151", total_memory_bytes=67076651745)
    cards = {(0, 0xC3, 0): (536870912, 137438953472)}
    (matched,) = attach_drm_memory([(apu, (0, 0xC3, 0))], cards)
    assert matched.unified_budget_bytes == 536870912 + 137438953472
    (alone,) = attach_drm_memory([(apu, None)], cards)  # one device, one card: that card
    assert alone.gtt_sysfs_bytes == 137438953472
    two = attach_drm_memory([(apu, None), (apu.model_copy(update={"index": 1}), None)], cards)
    assert [d.gtt_sysfs_bytes for d in two] == [None, None]  # never a guess


def test_meminfo_and_system_rocm(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       130989056 kB\nMemFree:  1000 kB\nMemAvailable:   125829120 kB\n")
    assert read_meminfo(meminfo) == (130989056 * 1024, 125829120 * 1024)
    assert read_meminfo(tmp_path / "absent") == (None, None)
    root = tmp_path / "rocm"
    assert read_system_rocm(root).layout == "absent"
    info = root / ".info"
    info.mkdir(parents=True)
    assert (read_system_rocm(root).version, read_system_rocm(root).layout) == (None, "unknown")
    (info / "version-dev").write_text("6.4.1-103\n")
    assert read_system_rocm(root) == SystemRocm(version="6.4.1-103", layout="legacy", file=".info/version")
    (info / "version").write_text("7.1.0-38\n")
    assert read_system_rocm(root).version == "7.1.0-38"


def _therock_core(root, name, version):
    """A TheRock native-package install: /opt/rocm/core-X.Y/.info/version (docs/rocm-facts.md#n19)."""
    info = root / name / ".info"
    info.mkdir(parents=True)
    (info / "version").write_text(f"{version}\n")
    return root / name


def test_therock_layout_is_read_and_named(tmp_path):
    root = tmp_path / "rocm"
    core = _therock_core(root, "core-10.0", "10.0.0")
    (root / "core-asan-10.0").mkdir()  # an ASAN build beside it: not a release install
    assert read_system_rocm(root) == SystemRocm(version="10.0.0", layout="therock", file="core-10.0/.info/version")
    _therock_core(root, "core-7.14", "7.14.0")
    several = read_system_rocm(root)  # two installs, no /opt/rocm/core link: which one is used is not known
    assert (several.version, several.layout, several.installs) == (None, "therock", ["core-7.14", "core-10.0"])
    os.symlink(core, root / "core")  # TheRock PR #2728: /opt/rocm/core -> core-X.Y
    os.symlink(core, root / "core-10")  # and core-<major>
    assert read_system_rocm(root) == SystemRocm(version="10.0.0", layout="therock", file="core/.info/version")


def test_probe_records_the_layout(tmp_path):
    host = probe_host()
    assert host.system_rocm_layout in {"legacy", "therock", "unknown", "absent"}
    assert host.system_rocm_layout != "absent" or host.system_rocm is None


def test_the_new_environment_variables_are_recorded():
    env = {"PYTORCH_NO_HIP_MEMORY_CACHING": "1", "NCCL_P2P_DISABLE": "1", "HSA_ENABLE_DXG_DETECTION": "1", "HOME": "/x"}
    assert relevant_env(env) == {k: "1" for k in ("PYTORCH_NO_HIP_MEMORY_CACHING", "NCCL_P2P_DISABLE",
                                                   "HSA_ENABLE_DXG_DETECTION")}  # fmt: skip


def test_a_schema_2_snapshot_loads_with_the_new_facts_unknown(tmp_path):
    old = json.loads((SNAPSHOTS / "rx7900xtx.json").read_text())
    assert old["schema_version"] == 2 and "host" not in old
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    snap = Snapshot.load(path)
    assert snap.schema_version == SNAPSHOT_SCHEMA_VERSION == 4
    assert snap.host.system_rocm_layout is None  # not probed then: unknown
    assert snap.host.memory_total_bytes is None and snap.devices[0].is_integrated is None
    assert snap.access.dxg_exists is False and snap.set_aside == []
    saved = tmp_path / "new.json"
    snap.save(saved)
    assert Snapshot.load(saved) == snap


def test_the_snapshot_records_no_path_of_the_toolchain():
    snap = Snapshot.load(SNAPSHOTS / "rx7900xtx_rocm_mismatch.json")
    assert set(snap.host.model_dump()) == {"memory_total_bytes", "memory_available_bytes", "system_rocm", "hipcc",
                                           "ninja", "rocm_home", "system_rocm_layout", "system_rocm_file",
                                           "system_rocm_installs"}  # fmt: skip
    therock = Snapshot.load(SNAPSHOTS / "mi300x_therock_rocm10.json").host
    assert not therock.system_rocm_file.startswith("/")  # relative to /opt/rocm: never a user's path
    assert all(isinstance(v, bool) for v in (snap.host.hipcc, snap.host.ninja, snap.host.rocm_home))


def test_installed_distributions_sees_an_install_and_a_removal(tmp_path, monkeypatch):
    """The names are kept between checks of one process while no folder on sys.path changes; installing or
    removing a distribution (its .dist-info folder) is seen at once."""
    from llamafactory_rocm.machine.probe import installed_distributions

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    assert "llamafactory-rocm-probe-demo" not in installed_distributions()
    info = site / "llamafactory_rocm_probe_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llamafactory_rocm_probe_demo\nVersion: 1.0\n")
    assert "llamafactory-rocm-probe-demo" in installed_distributions()
    (info / "METADATA").unlink()
    info.rmdir()
    assert "llamafactory-rocm-probe-demo" not in installed_distributions()
