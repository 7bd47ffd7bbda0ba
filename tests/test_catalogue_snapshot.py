"""The catalogue covers every target in the notes, with sources; snapshots round-trip; the probe runs."""

import json

import pytest

from llamafactory_rocm.machine.catalogue import base_arch, load_catalogue, normalise_alias
from llamafactory_rocm.machine.probe import probe_kfd, take_snapshot
from llamafactory_rocm.machine.snapshot import SNAPSHOT_SCHEMA_VERSION, Snapshot, gfx_target_from_version
from tests.conftest import ALL_SNAPSHOTS, load_snapshot
from tests.conftest import SNAPSHOTS as SNAPSHOTS_DIR

NOTES_TARGETS = {"gfx1100", "gfx1101", "gfx1102", "gfx1030", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
                 "gfx908", "gfx906",
                 # issue 22: RDNA4, the Ryzen APUs and the desktop iGPU (docs/rocm-facts.md#n1)
                 "gfx1200", "gfx1201", "gfx1150", "gfx1151", "gfx1103", "gfx1036"}  # fmt: skip


def test_every_target_in_the_notes_is_catalogued():
    assert set(load_catalogue().archs) == NOTES_TARGETS


def test_every_fact_has_a_source():
    for info in load_catalogue().archs.values():
        assert all(source.strip() for source in info.sources.values()), info.target


def test_aliases_are_unique_and_the_preset_gpus_exist():
    cat = load_catalogue()
    aliases = [p.alias for a in cat.archs.values() for p in a.products]
    assert len(aliases) == len(set(aliases))
    for alias, arch in {"mi300x": "gfx942", "mi250": "gfx90a", "mi250x": "gfx90a", "rx7900xtx": "gfx1100",
                        "w7900": "gfx1100", "mi100": "gfx908", "mi50": "gfx906", "rx9070xt": "gfx1201",
                        "rx9070": "gfx1201", "r9700": "gfx1201", "rx9060xt": "gfx1200", "strixhalo": "gfx1151",
                        "ryzenaimax395": "gfx1151", "mi355x": "gfx950", "mi350x": "gfx950"}.items():  # fmt: skip
        assert cat.gpu(alias)[1].target == arch


def test_gpu_names_are_matched_loosely():
    assert normalise_alias("RX 7900 XTX") == normalise_alias("rx-7900-xtx") == "rx7900xtx"
    assert load_catalogue().gpu("MI300X")[0].vram_gib == 192


def test_mi250_is_two_64_gb_devices():
    # one MI250X card is two GCDs, 64 GB each: torch sees two devices (the mi250 snapshot's node)
    product, _ = load_catalogue().gpu("mi250x")
    assert product.vram_gib == 64


def test_kfd_target_versions_match_their_targets():
    for info in load_catalogue().archs.values():
        assert gfx_target_from_version(info.gfx_target_version) == info.target


@pytest.mark.parametrize(("value", "target"), [(90010, "gfx90a"), (90402, "gfx942"), (110001, "gfx1101"), (0, None)])
def test_gfx_target_from_version(value, target):
    assert gfx_target_from_version(value) == target


def test_base_arch_drops_feature_suffixes():
    assert base_arch("gfx942:sramecc+:xnack-") == "gfx942"


@pytest.mark.parametrize("name", ALL_SNAPSHOTS)
def test_recorded_snapshots_round_trip(name, tmp_path):
    snap = load_snapshot(name)
    snap.save(tmp_path / "s.json")
    assert Snapshot.load(tmp_path / "s.json") == snap
    assert snap.source.startswith("recorded")


def test_probe_on_this_machine_returns_a_valid_snapshot():
    snap = take_snapshot()
    assert snap.source == "probe"
    assert Snapshot.model_validate(json.loads(snap.model_dump_json())) == snap
    import torch

    assert snap.torch.version == torch.__version__
    assert len(snap.devices) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_probe_reads_kfd_sysfs(tmp_path):
    for node, value in ((0, 0), (1, 90402), (2, 90402)):
        (tmp_path / str(node)).mkdir()
        (tmp_path / str(node) / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {value}\n")
    nodes = probe_kfd(tmp_path)
    assert [n.target for n in nodes] == [None, "gfx942", "gfx942"]


def test_a_snapshot_saved_with_the_whole_kernel_command_line_still_loads_reduced(tmp_path):
    """Users may hold schema-1 snapshots (kernel_cmdline, every group): they load as iommu_pt only."""
    old = json.loads((SNAPSHOTS_DIR / "mi300x.json").read_text())
    old.pop("iommu_pt")
    old["schema_version"] = 1
    old["kernel_cmdline"] = "BOOT_IMAGE=/vmlinuz root=UUID=1b2c ro iommu=pt"
    old["access"]["user_groups"] = ["alice", "render", "video", "wheel"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    snap = Snapshot.load(path)
    assert snap.iommu_pt is True and snap.schema_version == SNAPSHOT_SCHEMA_VERSION
    assert snap.access.user_groups == ["render", "video"]
    saved = snap.model_dump_json()
    assert "kernel_cmdline" not in saved and "UUID" not in saved and "alice" not in saved
    old["kernel_cmdline"] = "ro quiet"
    path.write_text(json.dumps(old))
    assert Snapshot.load(path).iommu_pt is False
    old["kernel_cmdline"] = None
    path.write_text(json.dumps(old))
    assert Snapshot.load(path).iommu_pt is None


def test_recorded_snapshots_hold_no_kernel_command_line():
    for path in SNAPSHOTS_DIR.glob("*.json"):
        data = json.loads(path.read_text())
        assert "kernel_cmdline" not in data and isinstance(data["iommu_pt"], bool), path.name


def test_apus_are_marked_integrated():
    cat = load_catalogue()
    for alias in ("strixhalo", "ryzenaimax395", "radeon890m", "radeon780m", "raphaeligpu", "mi300a"):
        product, _ = cat.gpu(alias)
        assert product.integrated, alias
    for alias in ("rx9070xt", "r9700", "mi355x", "rx7900xtx"):
        product, _ = cat.gpu(alias)
        assert not product.integrated, alias
    assert cat.gpu("r9700")[0].vram_gib == 32 and cat.gpu("mi355x")[0].vram_gib == 288


def _facts_section(anchor: str) -> str:
    """The text of one ``### <ANCHOR>`` entry of docs/rocm-facts.md."""
    text = (SNAPSHOTS_DIR.parents[1] / "docs" / "rocm-facts.md").read_text(encoding="utf-8")
    start = text.index(f"\n### {anchor.upper()}\n")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else len(text)]


# The arch facts rules read from the catalogue instead of holding literals (issue 31), each as the docs
# entry cited in its source states it.
RULE_FACTS = {
    "hip_page_faults": {"gfx1200": "lora_backward_gemm", "gfx1201": "lora_backward_gemm", "gfx1151": "memory_access"},
    "hip_page_faults_from_rocm": {"gfx1200": "7.2", "gfx1201": "7.2"},
    "fp16_failure": {"gfx90a": "silent_divergence", **dict.fromkeys(
        ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151"), "nan")},
    "bf16_divergence_report": {"gfx942": "bf16 grad_norm blow-ups on MI300: hiyouga/LLaMA-Factory#7890"},
    "successor": {"gfx940": "gfx942", "gfx941": "gfx942"},
    "multi_gpu_ddp_report": {"gfx1100": "hiyouga/LLaMA-Factory#6271"},
    "p2p_hang": {"gfx1200": True, "gfx1201": True},
    "slow_partial_node_gpu_counts": {"gfx942": [2, 4]},
}  # fmt: skip


@pytest.mark.parametrize("field", sorted(RULE_FACTS))
def test_the_rules_arch_facts_are_the_catalogues_and_the_docs(field):
    cat = load_catalogue()
    assert {a: getattr(i, field) for a, i in cat.archs.items() if getattr(i, field)} == RULE_FACTS[field]
    for arch, info in cat.archs.items():
        if not getattr(info, field):
            continue
        anchor = info.sources[field].split("#")[1].split()[0]
        section = _facts_section(anchor)
        # The cited entry names the arch, or the report the fact quotes, or (the gfx11 family's fp16 NaN)
        # the RX 7900 XTX it was seen on.
        value = str(getattr(info, field))
        said = arch in section or value.rpartition(": ")[2] in section
        said = said or (field == "fp16_failure" and value == "nan" and "RX 7900 XTX" in section)
        said = said or any(p.alias in normalise_alias(section) for p in info.products)  # mi300x: "MI300X"
        said = said or (field == "p2p_hang" and "Multi-GPU Radeon runs hang" in section)  # every Radeon
        assert said, (arch, field, anchor)
        if field == "hip_page_faults_from_rocm":
            assert f"used from ROCm {info.hip_page_faults_from_rocm}" in section


def test_the_rules_read_those_facts():
    from llamafactory_rocm.rules.precision import fp16_risk
    from llamafactory_rocm.train.guard import likely_cause

    cat = load_catalogue()
    assert fp16_risk(["gfx1100", "gfx90a"], cat).startswith("diverges silently on gfx90a")
    assert "RDNA3" in fp16_risk(["gfx1151"], cat) and "RDNA3" not in fp16_risk(["gfx942"], cat)
    assert "LLaMA-Factory#7890" in likely_cause(load_snapshot("mi300x"), "bf16", 1e-4)
    assert "#7890" not in likely_cause(load_snapshot("mi250x"), "bf16", 1e-4)


def test_overrides_in_the_wild_are_the_docs_and_stay_in_their_family():
    from llamafactory_rocm.rules.torch_build import override_target

    cat = load_catalogue()
    section = _facts_section(cat.hsa_overrides_in_the_wild_source.split("#")[1].split()[0])
    assert cat.hsa_overrides_in_the_wild
    for override in cat.hsa_overrides_in_the_wild:
        assert f"{'/'.join(override.targets)} ->" in section and override.value in section
        sibling = cat.arch(override_target(override.value))
        for target in override.targets:
            info = cat.arch(target)
            assert info is None or info.family == sibling.family, (target, override.value)


def test_the_serving_facts_are_the_published_lists_and_the_rules_read_them():
    # rules/serving.py reads vllm_rocm/sglang_rocm from the catalogue (one source); the sets are the ones
    # vLLM's ROCm requirements and SGLang's ROCm builds publish (docs/after-training.md#t3, #t5)
    cat = load_catalogue()
    assert set(cat.archs_where("vllm_rocm")) == {
        "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1150", "gfx1151", "gfx1200", "gfx1201"
    }  # fmt: skip
    assert set(cat.archs_where("sglang_rocm")) == {"gfx942", "gfx950"}
    assert set(cat.archs["gfx942"].rccl_env) >= {"NCCL_MIN_NCHANNELS", "HSA_NO_SCRATCH_RECLAIM"}
    for arch, info in cat.archs.items():
        for field in ("vllm_rocm", "sglang_rocm", "rccl_env"):
            if getattr(info, field):
                anchor = info.sources[field].split("#")[1].split()[0]
                doc = "after-training.md" if field != "rccl_env" else "rocm-facts.md"
                text = (SNAPSHOTS_DIR.parents[1] / "docs" / doc).read_text(encoding="utf-8")
                start = text.index(f"\n### {anchor.upper()}\n")
                section = text[start : text.find("\n### ", start + 1)]
                assert arch in section or arch[3:] in section or field == "rccl_env", (arch, field)
                if field == "rccl_env":  # each setting as the facts page writes it
                    assert all(f"{k}={v}" in section for k, v in info.rccl_env.items()), section


def _a3_rows() -> dict[str, list[str]]:
    """docs/rocm-facts.md#a3's table: each alias of a row -> its cells (CUs, FLOPS/clock/CU, clock, TFLOPS,
    status)."""
    rows = {}
    lines = _facts_section("a3").splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("| alias |"))) + 2 :]
    for line in table:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        for alias in cells[0].split(", "):
            rows[alias] = cells[2:]
    return rows


def _first_number(cell: str) -> float:
    import re

    return float(re.search(r"\d+(?:\.\d+)?", cell).group())


def test_each_peak_is_the_docs_figure_with_the_kind_of_its_source():
    """Every catalogue card is a row of docs/rocm-facts.md#a3's table; its peak is the row's package figure (halved
    where the package is two GCDs, two devices), its peak_source says the kind the table gives it, and a derived
    figure is the product of the row's own factors (compute units x FLOPS/clock/CU x clock). A card AMD publishes
    no bf16 rate for has no peak and says so."""
    from llamafactory_rocm.forecast.cards import peak_kind

    rows = _a3_rows()
    kinds = {"primary": "AMD's figure", "derived": "derived from AMD's figures", "secondary": "secondary",
             "none": "none published by AMD"}  # fmt: skip
    products = [p for arch in load_catalogue().archs.values() for p in arch.products]
    assert sorted(p.alias for p in products) == sorted(rows)
    for product in products:
        cus, per_cu, clock, figure, status = rows[product.alias]
        assert peak_kind(product.peak_source) == kinds[status], product.alias
        assert "docs/rocm-facts.md#a3" in product.peak_source and product.peak_date, product.alias
        if status == "none":
            assert product.peak_dense_bf16_tflops is None, product.alias
            continue
        devices = 2 if "per GCD" in cus else 1
        package = _first_number(figure.split("=")[0])
        assert product.peak_dense_bf16_tflops * devices == pytest.approx(package, rel=5e-4), product.alias
        if status == "derived":
            made = _first_number(cus) * _first_number(per_cu) * _first_number(clock) / 1000
            assert made == pytest.approx(package, rel=5e-4), product.alias


def test_every_radeon_preset_card_has_a_peak():
    """The cards the Radeon presets name (each preset's first line) all have a peak: `check --cards` times them."""
    import re

    from llamafactory_rocm.resources import presets_dir

    named = set()
    for preset in presets_dir().glob("*.yaml"):
        named |= set(re.findall(r"gpu=(\S+)", preset.read_text(encoding="utf-8").splitlines()[0]))
    radeon = {"rx7900xtx", "w7900", "r9700", "rx9070xt", "rx7800xt", "strixhalo"}
    assert radeon <= named
    for alias in named:
        assert load_catalogue().gpu(alias)[0].peak_dense_bf16_tflops, alias


def test_a_peak_without_its_source_is_refused():
    from pydantic import ValidationError

    from llamafactory_rocm.machine.catalogue import Product

    with pytest.raises(ValidationError, match="go together"):
        Product(name="AMD Instinct MI300X", alias="mi300x", vram_gib=192, peak_dense_bf16_tflops=1307.4)
    with pytest.raises(ValidationError, match="go together"):  # a source with no date
        Product(name="AMD Instinct MI300X", alias="mi300x", vram_gib=192, peak_dense_bf16_tflops=1307.4,
                peak_source="AMD: ROCm docs")  # fmt: skip
    with pytest.raises(ValidationError, match="go together"):
        Product(name="AMD Radeon RX 7900 XTX", alias="rx7900xtx", vram_gib=24, peak_source="AMD: nowhere")
    # "none published" goes with its date and without a peak
    none = "none published by AMD: no matrix cores (docs/rocm-facts.md#a3)"
    assert Product(name="AMD Instinct MI50", alias="mi50", vram_gib=32, peak_source=none, peak_date="2026-12-07")
    with pytest.raises(ValidationError, match="go together"):
        Product(name="AMD Instinct MI50", alias="mi50", vram_gib=32, peak_source=none)
    with pytest.raises(ValidationError, match="go together"):
        Product(name="AMD Instinct MI50", alias="mi50", vram_gib=32, peak_dense_bf16_tflops=26.5, peak_source=none,
                peak_date="2026-12-07")  # fmt: skip
