"""The finding-code registry covers every code the package can emit, and the docs hold its text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llamafactory_rocm import presets
from llamafactory_rocm.check.doctor import diagnose
from llamafactory_rocm.findings import Finding, Level
from llamafactory_rocm.findings.registry import LEVELS, declared_codes, load_codes
from llamafactory_rocm.rules import Target, resolve
from tests.conftest import ALL_SNAPSHOTS, load_snapshot, make_ctx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llamafactory_rocm"
CODE_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def _strings(node: ast.AST) -> set[str]:
    """Code-shaped string constants anywhere in an expression (``"X" if over else "Y"`` included)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and CODE_NAME.fullmatch(n.value)}  # fmt: skip


def codes_in_source(text: str) -> set[str]:
    """The codes a module emits: the value of a ``code=`` keyword, a ``CODE = "..."`` constant, or the
    first argument of a helper that builds the finding (``_info_finding("DATASET_REMOTE", ...)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.keyword) and node.arg == "code") or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id.lower().endswith("code") for t in node.targets)
        ):
            found |= _strings(node.value)
        elif isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if "finding" in name.lower():
                found |= _strings(node.args[0])
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")


def emitted_by_module() -> dict[str, set[str]]:
    out = {module_name(p): codes_in_source(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    return {module: codes for module, codes in out.items() if codes}


def source_codes() -> set[str]:
    return set().union(*emitted_by_module().values())


SEED = {
    "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "template": "llama3",
    "fp16": True,
    "compute_dtype": "bfloat16",
    "backend": "pt",
    "tf32": True,
    "flash_attn": "fa2",
    "output_dir": "saves/does-not-exist",
}
CONFIGS = [
    SEED,
    {**SEED, "bf16": True, "pure_bf16": True, "quantization_bit": 4, "lora_r": 8},
    {**SEED, "compute_dtype": "bf32", "backend": "deepspeed", "per_device_train_batch_size": 512},
]
ENVS = [
    {},
    {"PYTORCH_ROCM_ARCH": "gfx942:xnack+;gfx940;gfx90a;gfx94", "HSA_OVERRIDE_GFX_VERSION": "9.4.2"},
    {"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "ALLOW_EXTRA_ARGS": "1"},
]


def emitted_over_snapshots() -> set[str]:
    found: set[str] = set()
    configs = CONFIGS + [presets.raw(name) for name in presets.names()]
    for name in ALL_SNAPSHOTS:
        found |= {line.code for line in diagnose(load_snapshot(name)) if line.code}
        for target in (None, Target(arch="gfx942", alias="mi300x", named_by="--gpu")):
            ctx = make_ctx(name, target=target, existing_outputs=("checkpoint-10",))
            for config in configs:
                for env in ENVS:
                    found |= {f.code for f in resolve(config, env, ctx).findings}
    return found


def test_the_source_scan_finds_codes() -> None:
    assert codes_in_source('Finding(code="NOT_A_CODE", level=Level.INFO)') == {"NOT_A_CODE"}
    assert codes_in_source('_info_finding("NOT_A_CODE", msg)') == {"NOT_A_CODE"}
    assert {
        "TORCH_NOT_ROCM",
        "UNKNOWN_KEY",
        "DATASET_INVALID",
        "DATASET_REMOTE",
        "FLASH_ATTN_TO_SDPA",
    } <= source_codes()


def test_each_module_declares_exactly_the_codes_it_emits() -> None:
    """ruff's model: every code belongs to one rule; a module emitting a code it does not declare in
    findings/codes/<module>.json, or declaring one it does not emit, fails here."""
    emitted = emitted_by_module()
    declared = {module: set(entries) for module, entries in declared_codes().items()}
    problems = [
        f"{module}: emits {sorted(emitted.get(module, set()) - declared.get(module, set()))}, "
        f"declares but never emits {sorted(declared.get(module, set()) - emitted.get(module, set()))}"
        for module in sorted(set(emitted) | set(declared))
        if emitted.get(module, set()) != declared.get(module, set())
    ]
    assert problems == [], "fix llamafactory_rocm/findings/codes/<module>.json: " + "; ".join(problems)


def test_explain_names_the_rule_that_emits_the_code() -> None:
    text = load_codes().explain("TF32_DROPPED")
    assert "Rule:    llamafactory_rocm/rules/kernels.py" in text
    assert all((ROOT / entry.path).is_file() for entry in load_codes().codes.values())


def test_every_code_the_rules_emit_on_the_snapshots_has_an_entry() -> None:
    emitted = emitted_over_snapshots()
    assert len(emitted) >= 25  # the run reaches most rules, not a corner
    missing = sorted(emitted - set(load_codes().codes))
    assert missing == [], f"add an entry to llamafactory_rocm/findings/codes/<module>.json for {missing}"


@pytest.mark.parametrize("code", sorted(load_codes().codes))
def test_each_entry_is_complete_and_its_sources_resolve(code: str) -> None:
    entry = load_codes().codes[code]
    assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+", code)
    assert entry.level.split(" ")[0] in {level.value for level in Level}
    fixes = list(entry.fix.values()) if isinstance(entry.fix, dict) else [entry.fix]
    for text in (entry.summary, entry.what, entry.why, *fixes, entry.example):
        assert text.strip() and "\n" not in entry.summary
    for source in entry.source:
        page, _, anchor = source.partition("#")
        assert page.startswith("docs/") and (ROOT / page).is_file(), source
        text = (ROOT / page).read_text(encoding="utf-8")
        anchors = {h.lower() for h in re.findall(r"^### (\w+)\s*$", text, flags=re.M)}
        assert anchor in anchors, source


def test_rocm_codes_cite_the_facts() -> None:
    """A code whose reason is a ROCm fact names the fact."""
    codes = load_codes().codes
    rocm = [c for c in codes if c.startswith(("ROCM_", "HSA_", "QLORA_", "SDPA_", "TORCH_", "PRECISION_FP16"))]
    assert rocm and all(codes[c].source for c in rocm), [c for c in rocm if not codes[c].source]


def test_the_docs_table_is_the_registry() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    held = text.split("<!-- codes:start -->\n", 1)[1].split("\n<!-- codes:end -->", 1)[0]
    assert held == load_codes().markdown_table(), "regenerate it: llamafactory-rocm explain --markdown"


def test_every_finding_line_names_explain() -> None:
    finding = Finding(code="TF32_DROPPED", level=Level.CHANGE, message="tf32 raises.", fix="Removed it.")
    assert finding.line().endswith("(more: llamafactory-rocm explain TF32_DROPPED)")
    for line in diagnose(load_snapshot("mi300x")):
        if line.code and line.status != "pass":
            assert f"llamafactory-rocm explain {line.code}" in line.fix


# Where a finding is built: Finding(...) and DryRun's error()/add(), which pass their keywords on.
_FINDING_CALLS = {"Finding", "error", "add"}


def finding_calls(names: frozenset[str] | set[str] = _FINDING_CALLS) -> list[tuple[str, int, dict[str, ast.expr]]]:
    calls = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            keywords = {k.arg or "**": k.value for k in node.keywords}
            if name in names and "message" in keywords:
                calls.append((module_name(path), node.lineno, keywords))
    return calls


def test_no_rule_writes_fix_text_the_registry_holds_it() -> None:
    """Each fix is written once, in its code's entry: a call passes values (fix_with), never text (fix=)."""
    calls = finding_calls()
    assert len(calls) > 80  # the scan finds the package's findings
    assert [f"{module}:{line}" for module, line, keywords in calls if "fix" in keywords] == []


def test_each_call_names_a_case_its_code_has_and_fills_every_placeholder() -> None:
    """A literal code with a literal case and values: the template exists and formats with those values."""
    import string

    codes = load_codes().codes
    checked = 0
    for module, line, keywords in finding_calls():
        code = keywords.get("code")
        if not (isinstance(code, ast.Constant) and code.value in codes) or "**" in keywords:
            continue  # a code or fix chosen at run time: the rule's own tests build it
        fix = codes[code.value].fix
        case = keywords.get("fix_as")
        if isinstance(fix, dict):
            assert case is not None, f"{module}:{line}: {code.value} has a fix a case; name one with fix_as"
            if not isinstance(case, ast.Constant):
                continue  # chosen at run time: the rule's tests format it
            assert case.value in fix, f"{module}:{line}: {code.value} has no case {case.value!r}"
            template = fix[case.value]
        else:
            assert case is None, f"{module}:{line}: {code.value} has one fix, not cases"
            template = fix
        given = keywords.get("fix_with")
        if given is not None and not isinstance(given, ast.Dict):
            continue
        names = {k.value for k in given.keys if isinstance(k, ast.Constant)} if given is not None else set()
        wanted = {field for _, field, _, _ in string.Formatter().parse(template) if field}
        assert wanted == names, f"{module}:{line}: {code.value} fills {sorted(names)}, its template {sorted(wanted)}"
        checked += 1
    assert checked > 60


def test_a_finding_passes_its_level_only_where_its_code_entry_does_not_decide_it() -> None:
    """A finding's level is its code's entry's (Finding defaults it): a call passes ``level=`` where the entry
    says the level varies, or with a reason to differ; never the one level the entry declares again."""
    codes = load_codes().codes
    redundant, undecided = [], []
    for module, line, keywords in finding_calls({"Finding"}):  # DryRun.error() passes error itself
        code = keywords.get("code")
        if not (isinstance(code, ast.Constant) and code.value in codes) or "**" in keywords:
            continue  # a code chosen at run time passes its level (the rule's own tests build it)
        declared = codes[code.value].level
        level = keywords.get("level")
        if level is None and declared not in LEVELS:
            undecided.append(f"{module}:{line}: {code.value} ({declared})")
        if isinstance(level, ast.Attribute) and level.attr.lower() == declared:
            redundant.append(f"{module}:{line}: {code.value} passes level={declared} again")
    assert undecided == [] and redundant == []


@pytest.mark.parametrize("code", ["PLOT_LOSS_ADDED", "CHECKPOINT_ROTATION"])
def test_a_finding_without_level_takes_its_entrys_or_says_it_must_pass_one(code: str) -> None:
    declared = load_codes().codes[code].level
    if declared in LEVELS:
        assert Finding(code=code, message="m", fix="f").level is Level(declared)
    else:  # "error (info on a resumed run ...)": the call decides
        with pytest.raises(KeyError, match="level varies"):
            Finding(code=code, message="m", fix="f")
