"""Dataset checks: what datasets' loader and LLaMA-Factory's converter will say about a config's data.

``config_dataset_findings(config, cwd)`` is the entry point the pre-launch check uses; ``validate_dataset``,
``add_dataset`` and ``prepare`` (``prepare.py``) back the ``datasets`` and ``prepare`` commands.
"""

from __future__ import annotations

from .findings import config_dataset_findings
from .info import load_dataset_info
from .register import add_dataset
from .validate import CheckOptions, DatasetReport, validate_dataset, validate_entry

__all__ = [
    "CheckOptions",
    "DatasetReport",
    "add_dataset",
    "config_dataset_findings",
    "load_dataset_info",
    "validate_dataset",
    "validate_entry",
]
