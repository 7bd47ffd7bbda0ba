"""Dataset checks: what LLaMA-Factory's loader and converter will say about a config's data.

``config_dataset_findings(config, cwd)`` is the one entry point the pre-launch check uses.
"""

from __future__ import annotations

from ..dataset_check import config_dataset_findings

__all__ = ["config_dataset_findings"]
