"""``train``: check, refuse on errors, record, then hand over to LLaMA-Factory's own launcher.

The resolved config is written as YAML and LLaMA-Factory's ``launcher.launch()`` is called with it,
exactly as ``llamafactory-cli train resolved.yaml`` would be: multi-GPU (torchrun) re-executes
the launcher with that file, so every rank trains on the resolved config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .. import _startup
from ..check.config_io import load_config, load_launch_args
from ..check.record import write_launch_files
from ..check.render import report_text
from ..check.run import Report, check_config
from ..errors import EXIT_FINDINGS, EXIT_OK
from ..lf.text_only import text_only_llamafactory
from .hook import CHECKED_ENV, config_digest


def prepare_training(
    launch_args: list[str] | tuple[str, ...] | str | Path,
    gpu: str | None = None,
    arch: str | None = None,
    accept: str | None = None,
) -> Report:
    """Check what ``llamafactory-cli train`` would get (``cfg.yaml key=value ...`` or ``--key value ...``)
    on this machine: a named target is a requirement here, not a plan."""
    if isinstance(launch_args, (str, Path)):  # a config file alone
        launch_args = [str(launch_args)]
    config, config_path = load_launch_args(launch_args)
    return check_config(
        config, config_path=config_path, gpu=gpu, arch=arch, plan_without_gpu=False, accept=accept or _env_accept()
    )


def _env_accept() -> str | None:
    from ..findings import ACCEPT_ENV

    return os.environ.get(ACCEPT_ENV)


HANDED_OVER = False  # True once LLaMA-Factory runs: its errors are its own, shown as it shows them


def hand_over(resolved_yaml: Path) -> int:
    """Run LLaMA-Factory's launcher on ``resolved_yaml`` in this process; return its exit code."""
    global HANDED_OVER
    HANDED_OVER = True
    _startup.install(force=True)  # guard + torchaudio fallback even with LLAMAFACTORY_ROCM=0
    from .verbosity import quiet_by_default

    quiet_by_default()  # before LLaMA-Factory's first import: its loggers read LLAMAFACTORY_VERBOSITY once
    with text_only_llamafactory():
        from llamafactory import launcher
    saved_argv = sys.argv
    sys.argv = ["llamafactory-cli", "train", str(resolved_yaml)]
    try:
        launcher.launch()
    except subprocess.CalledProcessError as exc:  # torchrun child failed; it printed why
        return exc.returncode or 1
    finally:
        sys.argv = saved_argv
    return EXIT_OK


def train(
    launch_args: list[str] | tuple[str, ...] | str | Path,
    gpu: str | None = None,
    arch: str | None = None,
    accept: str | None = None,
    origin: str = "llamafactory-rocm train",
) -> int:
    report = prepare_training(launch_args, gpu, arch, accept)
    print(report_text(report), flush=True)
    if not report.ok:
        return EXIT_FINDINGS
    output_dir = Path(str(report.config.get("output_dir", "trainer_output")))
    resolved, record = write_launch_files(report, output_dir, origin)
    print(f"\nlaunch record: {record}\nresolved config: {resolved}\n", flush=True)
    os.environ.update(report.resolution.env_changes)
    os.environ[CHECKED_ENV] = config_digest(load_config(resolved))
    return hand_over(resolved)
