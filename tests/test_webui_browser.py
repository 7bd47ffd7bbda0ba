"""LlamaBoard in a real browser: the check's verdict and the loss in its page, a refusal's one-line reason.

Stock ``llamafactory-cli webui`` (LLaMA-Factory's files unchanged; the hook arrives through the .pth
file) on a local port, driven by the distribution's headless Chromium through Playwright (no browser
download: ``executable_path``). The page is filled in as a person would: model name Custom, the tiny
model's path, the bundled data dir and dataset, a few extra arguments to keep the run short; then Start.
The ready run's adapter is then merged from the Export tab (first into a file, refused) and loaded in the
Chat tab, in the same page: those two run in LlamaBoard's own process, not in a child.

Oracles: LLaMA-Factory's own files of the run (``trainer_log.jsonl``: the losses the page must show;
``training_args.yaml``, the config LlamaBoard handed to ``llamafactory-cli train``, refused by
LLaMA-Factory's own ``get_train_args`` too), the launch records the run and the export wrote, the merged
folder, and the page's text (the tabs' boxes are textareas: their values).

Needs: the webui and browser extras (``pip install -e ".[test,webui,browser]"``) and Chromium
(Debian: ``apt-get install -y chromium``; elsewhere set LLAMAFACTORY_ROCM_CHROMIUM to its path). A
missing piece fails with that sentence; it is never skipped. ``LLAMAFACTORY_ROCM_SCREENSHOTS=docs``
writes the screenshots docs/llamaboard.md shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.resources import datasets_dir
from tests.test_exposure import _free_port, start_webui, stop, wait_served

pytestmark = pytest.mark.browser

CHROMIUM_ENV = "LLAMAFACTORY_ROCM_CHROMIUM"
SCREENSHOTS_ENV = "LLAMAFACTORY_ROCM_SCREENSHOTS"
SHORT_RUN = {"optim": "adamw_torch", "max_steps": 6, "logging_steps": 1, "max_samples": 64, "cutoff_len": 128}
RUN_TIMEOUT_S = 300
TAB_TIMEOUT_S = 120  # an export or a chat load of the tiny model: seconds
WIDTH = 1800  # wide enough for a finding line in the log box beside the loss plot


def chromium_path() -> str:
    """The distribution's Chromium, or a clear failure naming how to get it (never a skip)."""
    for candidate in (os.environ.get(CHROMIUM_ENV), "chromium", "chromium-browser", "google-chrome"):
        found = candidate and (shutil.which(candidate) or (Path(candidate).is_file() and candidate))
        if found:
            return str(found)
    pytest.fail(
        f"no Chromium for the LlamaBoard page test: install it (Debian/Ubuntu: apt-get install -y chromium) "
        f"or set {CHROMIUM_ENV}=/path/to/chromium",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory):
    """A LlamaBoard on 127.0.0.1 and a headless Chromium page factory."""
    for module, extra in (("gradio", "webui"), ("playwright", "browser")):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"the LlamaBoard page test needs {module}: pip install -e '.[{extra}]'", pytrace=False)
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    workdir = tmp_path_factory.mktemp("board")
    port = _free_port()
    proc, log = start_webui(workdir, port, GRADIO_SERVER_NAME="127.0.0.1")
    try:
        wait_served(proc, log, port)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, headless=True)
            try:
                yield {"url": f"http://127.0.0.1:{port}/", "browser": browser, "workdir": workdir, "log": log}
            finally:
                browser.close()
    finally:
        stop(proc)


def start_training(board: dict, model: Path, output_dir: str, extra_args: dict):
    """Fill the Train tab as a person would and press Start; returns the page."""
    page = board["browser"].new_page(viewport={"width": WIDTH, "height": 1000})
    page.goto(board["url"])
    page.get_by_label("Model path").wait_for(timeout=120_000)
    model_name = page.get_by_label("Model name")
    model_name.click()
    model_name.fill("Custom")
    model_name.press("Enter")
    page.wait_for_timeout(1000)  # its change event fills model path and template: ours come after
    page.get_by_label("Model path").fill(str(model))
    data_dir = page.get_by_label("Data dir").first  # the Train tab's (the Evaluate tab has one too)
    data_dir.fill(str(datasets_dir()))
    data_dir.press("Tab")
    dataset = page.get_by_label("Dataset").first
    dataset.click()
    dataset.fill("amd_finetune_qa")
    dataset.press("Enter")
    page.get_by_label("Learning rate").first.fill("2e-2")  # the tiny model's (tests/conftest.py)
    page.get_by_label("Output dir").first.fill(output_dir)
    page.get_by_text("Extra configurations").first.click()  # a closed accordion holds Extra arguments
    page.get_by_label("Extra arguments").first.fill(json.dumps(extra_args))
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Start", exact=True).click()
    return page


def wait_finished(page, board: dict) -> str:
    """LlamaBoard's own end states (locales.py ALERTS: info_finished "Finished.", err_failed "Failed."). A failed
    run's toast says "Failed." before the output box says "Failed. Exit code: N" (one CI run read the page
    between the two), so a failure is taken from the box's line."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        text = page.inner_text("body")
        if re.search(r"^(Finished\.|Failed\. Exit code: -?\d+$)", text, flags=re.M):
            return text
        time.sleep(2)
    raise AssertionError(f"no end state in the page after {RUN_TIMEOUT_S} s: {board['log'].read_text()[-3000:]}")


def text_top(page, needle: str) -> float:
    """The page y of the first text node holding ``needle`` (for a screenshot around it)."""
    box = page.evaluate(
        """(needle) => {
            const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
            for (let n = walker.nextNode(); n; n = walker.nextNode()) {
                const i = n.data.indexOf(needle);
                if (i >= 0) {
                    const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + needle.length);
                    return r.getBoundingClientRect().top + window.scrollY;
                }
            }
            return null;
        }""",
        needle,
    )
    assert box is not None, f"{needle!r} is not in the page"
    return float(box)


def page_top(locator) -> float:
    """A locator's y on the page (bounding_box() is relative to the scrolled viewport)."""
    return float(locator.evaluate("e => e.getBoundingClientRect().top + window.scrollY"))


def screenshot(page, name: str, top: float, height: float, tmp_path: Path) -> None:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(folder / name), full_page=True, clip={"x": 0, "y": max(top, 0), "width": WIDTH, "height": height}
    )


def run_dir(board: dict, output_dir: str) -> Path:
    """Where LlamaBoard puts a run: saves/<model name>/<method>/<output dir> (webui/common.py get_save_dir)."""
    return board["workdir"] / "saves" / "Custom" / "lora" / output_dir


@pytest.fixture(scope="module")
def ready_run(board, tiny_model) -> dict:
    """The ready run, trained once from the Train tab: the page at its end state, and the run's folder."""
    page = start_training(board, tiny_model, "ready-run", SHORT_RUN)
    text = wait_finished(page, board)
    yield {"page": page, "text": text, "out": run_dir(board, "ready-run")}
    page.close()


def test_a_ready_run_shows_the_findings_the_loss_and_the_summary_in_the_page(ready_run, tmp_path):
    page, text, out = ready_run["page"], ready_run["text"], ready_run["out"]
    assert re.search(r"^Finished\.", text, flags=re.M), text[-3000:]
    record = json.loads((out / "rocm_launch.json").read_text())
    shown = [f["code"] for f in record["findings"] if f"] {f['code']}: " in text]
    assert shown and shown == [f["code"] for f in record["findings"]], (record["findings"], text[-5000:])
    assert "llamafactory-rocm: pre-launch check" in text and "ok: ready to launch" in text
    # The closing summary, logged after run_exp returns (about 1.8 s before the process ends): LlamaBoard's
    # final box repeats its last read of running_log.txt, taken before its 2 s wait for the process; the
    # hook's Runner.monitor reads the log once more for that box (train/board.py final_log_reread).
    summary = text[text.index("llamafactory-rocm: training summary") :]
    adapter = f"adapter +{re.escape(str(out.relative_to(board_dir(out))))}/adapter_model.safetensors"
    assert re.search(r"steps +6\n", summary) and re.search(adapter, summary), summary
    # the check's forecast block before the run, and the summary's forecast beside it (train/summary.py)
    assert "  how (docs/forecast.md):" in text and "  steps: 6 optimizer steps: " in text, text[-5000:]
    assert re.search(r"forecast +6 steps \(global_step 6\)", summary), summary
    rows = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    logged = [row["loss"] for row in rows if "loss" in row]  # the last row closes the run, without a loss
    in_page = [float(v) for v in re.findall(r"'loss': ([0-9.]+)", text)]
    assert len(logged) == SHORT_RUN["max_steps"] and in_page == pytest.approx(logged, abs=1e-4), (logged, in_page)
    assert page.locator("[data-testid='matplotlib'] img").first.is_visible()  # LlamaBoard's loss plot (gr.Plot)
    start = page_top(page.get_by_role("button", name="Start", exact=True))
    screenshot(page, "llamaboard-ready-plot.png", start - 20, 420, tmp_path)
    screenshot(page, "llamaboard-ready.png", text_top(page, "llamafactory-rocm: pre-launch check") - 10, 560, tmp_path)
    screenshot(
        page, "llamaboard-summary.png", text_top(page, "llamafactory-rocm: training summary") - 10, 230, tmp_path
    )


def board_dir(out: Path) -> Path:
    """LlamaBoard's working folder, which its saves/<model>/<method>/<name> paths are relative to."""
    return out.parents[3]


def box_value(page, button: str, needles: tuple[str, ...]) -> str:
    """Press ``button``, then the tab's box once it holds a new text with one of ``needles`` (an end state),
    or gradio's error toast."""
    from playwright.sync_api import TimeoutError as PageTimeout

    before = [t.input_value() for t in page.locator("textarea").all()]
    page.get_by_role("button", name=button, exact=True).click()
    try:
        box = page.wait_for_function(
            """([needles, before]) => {
            for (const t of document.querySelectorAll("textarea")) {
                const fresh = t.offsetParent && !before.includes(t.value);
                if (fresh && needles.some((n) => t.value.includes(n))) return t;
            }
            const error = document.querySelector(".toast-body.error");  // gradio's toast for an exception
            return error ? error : null;
        }""",
            arg=[list(needles), before],
            timeout=TAB_TIMEOUT_S * 1000,
        ).as_element()
    except PageTimeout:
        boxes = [t.input_value() for t in page.locator("textarea").all() if t.is_visible()]
        raise AssertionError(f"none of {needles} in the page's boxes after {TAB_TIMEOUT_S} s: {boxes}") from None
    return box.input_value() if box.evaluate("e => e.tagName") == "TEXTAREA" else "gradio error: " + box.inner_text()


def select_checkpoint(page, name: str) -> None:
    """Type ``name`` into LlamaBoard's "Checkpoint path" dropdown until it shows as selected. One CI run's Enter
    was lost (the export then said "Please select an adapter."): the dropdown's choices are re-rendered when the
    run's folder appears, and a keystroke during that re-render is dropped."""
    import time

    checkpoint = page.get_by_label("Checkpoint path")
    chosen = page.locator(".token", has_text=name)
    deadline = time.monotonic() + TAB_TIMEOUT_S
    while not chosen.count():
        assert time.monotonic() < deadline, f"{name} not selected in Checkpoint path after {TAB_TIMEOUT_S} s"
        checkpoint.click()
        checkpoint.fill(name)
        checkpoint.press("Enter")
        page.wait_for_timeout(500)


def box_screenshot(page, value: str, name: str, tmp_path: Path) -> None:
    """The tab's button row and its box (a textarea: its text is not in the page's text nodes)."""
    box = next(b for b in page.locator("textarea").all() if b.is_visible() and b.input_value() == value)
    top, height = page_top(box), box.evaluate("e => e.getBoundingClientRect().height")
    screenshot(page, name, top - 70, height + 90, tmp_path)


def test_export_and_chat_from_the_page_show_the_check_a_refusal_its_reason(ready_run, tmp_path):
    """The adapter of the ready run, merged from the Export tab and loaded in the Chat tab, which run in
    LlamaBoard's own process; first an export_dir that is a file, refused in one line with its fix."""
    page, out = ready_run["page"], ready_run["out"]
    select_checkpoint(page, out.name)
    page.get_by_role("tab", name="Export").click()
    export_dir = page.get_by_label("Export dir")
    notes = tmp_path / "notes.txt"
    notes.write_text("a user's file\n")
    export_dir.fill(str(notes))
    refused = box_value(page, "Export", ("[error]", "Model exported.", "Please select an adapter."))
    (line,) = [line for line in refused.splitlines() if "[error]" in line]
    assert f"EXPORT_DIR_NOT_A_FOLDER: export_dir {notes} is a file" in line and "Fix: " in line, refused
    assert "Traceback" not in refused and "Model exported." not in refused
    assert notes.read_text() == "a user's file\n"
    box_screenshot(page, refused, "llamaboard-export-refused.png", tmp_path)

    merged = tmp_path / "merged"
    export_dir.fill(str(merged))
    exported = box_value(page, "Export", (f"llamafactory-rocm: merged model {merged}", "[error]"))
    assert exported.startswith("Model exported.") and "Traceback" not in exported, exported
    assert (merged / "config.json").is_file() and list(merged.glob("model*.safetensors")), sorted(merged.iterdir())
    record = json.loads((merged / "rocm_launch.json").read_text())  # the export's record, beside the model
    assert all(f"] {f['code']}: " in exported for f in record["findings"]), (record["findings"], exported)
    assert "llamafactory-rocm: pre-launch check" in exported and "ok: ready to launch" in exported, exported
    box_screenshot(page, exported, "llamaboard-export.png", tmp_path)

    page.get_by_role("tab", name="Chat").click()
    loaded = box_value(page, "Load model", ("llamafactory-rocm: webchat engine", "[error]"))
    assert loaded.startswith("Model loaded,") and "Traceback" not in loaded, loaded
    assert "llamafactory-rocm: pre-launch check" in loaded and "ok: ready to launch" in loaded, loaded
    assert re.search(r"engine huggingface on cpu \((float32|bfloat16|float16)\)", loaded), loaded
    assert f"+ adapter {out.relative_to(board_dir(out))}" in loaded or f"+ adapter {out}" in loaded, loaded
    box_screenshot(page, loaded, "llamaboard-chat.png", tmp_path)


def test_a_refused_run_shows_its_one_line_reason_in_the_page(board, tiny_model, tmp_path):
    """A typo among the extra arguments: LLaMA-Factory's parser refuses it too (with a traceback, hook off)."""
    page = start_training(board, tiny_model, "refused-run", {**SHORT_RUN, "lora_rnak": 8})
    text = wait_finished(page, board)
    out = run_dir(board, "refused-run")
    assert re.search(r"^Failed\. Exit code: 1$", text, flags=re.M), text[-3000:]
    (line,) = [line for line in text.splitlines() if "[error]" in line]
    assert "UNKNOWN_KEY: 'lora_rnak'" in line and "Did you mean 'lora_rank'?" in line, line
    assert "refused: fix the errors above" in text and "Traceback" not in text
    assert not (out / "adapter_model.safetensors").exists()
    # LLaMA-Factory's own parser on what LlamaBoard handed to llamafactory-cli train: not runnable either.
    from llamafactory.hparams import get_train_args

    handed = yaml.safe_load((out / "training_args.yaml").read_text())
    with pytest.raises(ValueError):  # on this CPU it stops first at LlamaBoard's bf16 (without use_cpu)
        get_train_args(handed)
    with pytest.raises(ValueError, match="lora_rnak"):  # where bf16 is not the first stop, at the typo
        get_train_args({**handed, "bf16": False})
    start = page_top(page.get_by_role("button", name="Start", exact=True))
    screenshot(page, "llamaboard-refused.png", start - 20, 640, tmp_path)
    page.close()
