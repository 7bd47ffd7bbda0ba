"""``train``: check, refuse on errors, record, then hand over to LLaMA-Factory's own launcher.

The resolved config is written as YAML and LLaMA-Factory's ``launcher.launch()`` is called with it,
exactly as ``llamafactory-cli train resolved.yaml`` would be: multi-GPU (torchrun) re-executes
the launcher with that file, so every rank trains on the resolved config.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import _startup
from ..check.config_io import dump_yaml, load_config
from ..check.record import write_launch_files
from ..check.render import report_text
from ..check.request import from_launch_args
from ..check.run import Report, run_check
from ..errors import EXIT_DIVERGED, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_NODES_DISAGREE, EXIT_OK, EXIT_USAGE
from ..findings import ACCEPT_ENV
from ..lf.library import launch
from ..lf.patching import Patches
from ..lf.schema import output_dir_of
from .hook import CHECKED_ENV, EXIT_DIR_ENV, checked_token


def prepare_training(
    launch_args: list[str] | tuple[str, ...] | str | Path,
    gpu: str | None = None,
    arch: str | None = None,
    accept: str | None = None,
    origin: str = "llamafactory-rocm train",
) -> Report:
    """Check what ``llamafactory-cli train`` would get (``cfg.yaml key=value ...`` or ``--key value ...``)
    on this machine: a named target is a requirement here, not a plan."""
    from ..forecast.flops import requested

    request = from_launch_args(launch_args, origin=origin, gpu=gpu, arch=arch, accept=accept, plan=False)
    with requested():  # the forecast goes in the record, where the hook's summary finds it (train/hook.py)
        return run_check(request)


HANDED_OVER = False  # True once LLaMA-Factory runs: its errors are its own, shown as it shows them
# torchrun reports any failed rank as exit 1; the ranks' own codes, most telling first (README, exit codes).
_RANK_CODES = (EXIT_NODES_DISAGREE, EXIT_DIVERGED, EXIT_INTERNAL, EXIT_USAGE, EXIT_FINDINGS)


def hand_over(resolved_yaml: Path) -> int:
    """Run LLaMA-Factory's launcher on ``resolved_yaml`` in this process; return its exit code, or the
    failed rank's own code when torchrun ran the ranks."""
    global HANDED_OVER
    HANDED_OVER = True
    _startup.install(force=True)  # guard + torchaudio fallback even with LLAMAFACTORY_ROCM=0
    from .verbosity import quiet_by_default

    quiet_by_default()  # before LLaMA-Factory's first import: its loggers read LLAMAFACTORY_VERBOSITY once
    with tempfile.TemporaryDirectory(prefix="llamafactory-rocm-exit-") as exits, Patches() as patches:
        patches.setattr(sys, "argv", ["llamafactory-cli", "train", str(resolved_yaml)])
        patches.setenv(EXIT_DIR_ENV, exits)
        try:
            launch()
        except subprocess.CalledProcessError as exc:  # a torchrun child failed; it printed why
            codes = {int(p.read_text()) for p in Path(exits).iterdir() if p.read_text().strip().isdigit()}
            return next((code for code in _RANK_CODES if code in codes), exc.returncode or 1)
    return EXIT_OK


def train(
    launch_args: list[str] | tuple[str, ...] | str | Path,
    gpu: str | None = None,
    arch: str | None = None,
    accept: str | None = None,
    origin: str = "llamafactory-rocm train",
) -> int:
    report = prepare_training(launch_args, gpu, arch, accept, origin)
    print(report_text(report), flush=True)
    if not report.ok:
        return EXIT_FINDINGS
    output_dir = Path(output_dir_of(report.config))
    try:
        resolved, record = write_launch_files(report, output_dir, report.origin)
        print(f"\nlaunch record: {record}\nresolved config: {resolved}\n", flush=True)
    except OSError as exc:  # a warning: the resolved config trains regardless, from a file elsewhere
        resolved = Path(tempfile.mkdtemp(prefix="llamafactory-rocm-")) / "rocm_resolved.yaml"
        resolved.write_text(dump_yaml(report.config), encoding="utf-8")
        print(f"\nwarning: the launch record could not be written in {output_dir} ({exc}); training goes on.\n")
    os.environ.update(report.resolution.env_changes)
    if report.accepted:  # --accept reaches every rank: the hook's check and the node agreement read it there
        os.environ[ACCEPT_ENV] = ",".join(sorted(report.accepted))
    from ..machine.probe import relevant_env

    # The ranks trust this check when they read the same config on the same machine (train/hook.py): the
    # machine is the one the check probed, with the environment the ranks will see (env_changes applied).
    machine = report.snapshot.model_copy(update={"env": relevant_env()})
    os.environ[CHECKED_ENV] = checked_token(load_config(resolved), machine)
    return hand_over(resolved)
