"""No open door by surprise: LlamaBoard, webchat and the API beyond the loopback without a password or key.

LLaMA-Factory's servers listen on every interface by default and ask for nothing:

- ``llamafactory-cli webui`` (LlamaBoard) and ``webchat``: ``llamafactory/webui/interface.py``
  ``run_web_ui``/``run_web_demo`` read ``server_name = os.getenv("GRADIO_SERVER_NAME", "[::]" if
  gradio_ipv6 else "0.0.0.0")`` with ``gradio_ipv6 = is_env_enabled("GRADIO_IPV6")`` and ``gradio_share =
  is_env_enabled("GRADIO_SHARE")``, and call gradio's ``launch(share=..., server_name=...)`` with no
  ``auth``: there is no password at all. ``share`` adds a public link that reaches the page from anywhere.
- ``llamafactory-cli api``: ``llamafactory/api/app.py`` ``run_api`` reads ``api_host =
  os.getenv("API_HOST", "0.0.0.0")``; ``create_app`` reads ``api_key = os.getenv("API_KEY")`` and checks
  the bearer token only ``if api_key``.

Those lines cannot be called (they sit inside the functions that start the servers), so they are
restated here and pinned to the installed LLaMA-Factory's source by tests/test_exposure.py, which also
starts the real LlamaBoard and reads where its socket listens. ``is_env_enabled`` is LLaMA-Factory's own.
Nothing is changed: the user is told once, at start, with the fix (docs/llamaboard.md#x1).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

from ..findings import Finding
from .commands import REGISTRY, command_entry
from .patching import Patches

# Which commands start which server, and how the line names each: their entries' ``exposure`` (lf/commands.py
# REGISTRY); webui and webchat share the gradio variables.
GRADIO_PORT = "7860"  # gradio's default when GRADIO_SERVER_PORT is unset (gradio/networking.py)
API_PORT = "8000"  # run_api: int(os.getenv("API_PORT", "8000"))


def _is_env_enabled(environ: Mapping[str, str], name: str) -> bool:
    """LLaMA-Factory's own reading (extras/misc.py ``is_env_enabled``), applied to ``environ``."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.extras.misc import is_env_enabled

    if environ is os.environ:
        return bool(is_env_enabled(name))
    with Patches() as patches:  # is_env_enabled reads os.environ: give it this environ's value for the one call
        if name in environ:
            patches.setenv(name, environ[name])
        else:
            patches.delenv(name)
        return bool(is_env_enabled(name))


def gradio_server(environ: Mapping[str, str]) -> tuple[str, bool]:
    """(server_name, share) as run_web_ui and run_web_demo read them (webui/interface.py)."""
    ipv6 = _is_env_enabled(environ, "GRADIO_IPV6")
    share = _is_env_enabled(environ, "GRADIO_SHARE")
    return environ.get("GRADIO_SERVER_NAME", "[::]" if ipv6 else "0.0.0.0"), share


def api_server(environ: Mapping[str, str]) -> tuple[str, bool]:
    """(api_host, has_key) as run_api and create_app read them (api/app.py): an empty API_KEY is no key."""
    return environ.get("API_HOST", "0.0.0.0"), bool(environ.get("API_KEY"))


def is_loopback(host: str) -> bool:
    """Whether a listening address reaches this machine only: 127.0.0.0/8, ::1 or localhost."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # another host name: it resolves beyond the loopback unless it is localhost
        return False


def _where(host: str) -> str:
    name = host.strip().strip("[]")
    try:
        every = ipaddress.ip_address(name).is_unspecified
    except ValueError:
        every = False
    return f"{host} (every interface)" if every else host


def gradio_finding(environ: Mapping[str, str], name: str = "LlamaBoard/webchat") -> Finding | None:
    """LLAMABOARD_EXPOSED when LlamaBoard/webchat would be reachable beyond this machine (never a password)."""
    host, share = gradio_server(environ)
    if is_loopback(host) and not share:
        return None
    port = environ.get("GRADIO_SERVER_PORT", GRADIO_PORT)
    reach = [] if is_loopback(host) else [f"listens on {_where(host)}"]
    if share:
        reach.append("publishes a public share link (GRADIO_SHARE)")
    return Finding(
        code="LLAMABOARD_EXPOSED",
        key="GRADIO_SERVER_NAME",
        old=host,
        message=(
            f"{name} {' and '.join(reach)} with no password: anyone who reaches it can start "
            "jobs on this machine's GPUs and read or write its files."
        ),
        fix_with={"no_share": " and without GRADIO_SHARE" if share else "", "port": port},
    )


def api_finding(environ: Mapping[str, str]) -> Finding | None:
    """API_EXPOSED when the API would be reachable beyond this machine without API_KEY."""
    host, has_key = api_server(environ)
    if is_loopback(host) or has_key:
        return None
    port = environ.get("API_PORT", API_PORT)
    return Finding(
        code="API_EXPOSED",
        key="API_KEY",
        old=host,
        message=(
            f"the API listens on {_where(host)}, port {port}, with no key: anyone who reaches it can use "
            "the model on this machine's GPUs."
        ),
        fix_with={"port": port},
    )


def exposure_findings(
    environ: Mapping[str, str] | None = None, commands: tuple[str, ...] | None = None
) -> list[Finding]:
    """What ``commands`` (default: every command that starts a server) would expose if started with
    ``environ`` (default: this process's); for ``doctor``."""
    env = os.environ if environ is None else environ
    names = [e.name for e in REGISTRY if e.exposure is not None] if commands is None else commands
    servers = [exposure for exposure in (command_entry(name).exposure for name in names) if exposure is not None]
    found = []
    gradio = [exposure.label for exposure in servers if exposure.server == "gradio"]
    if gradio:
        found.append(gradio_finding(env, "/".join(gradio)))
    if any(exposure.server == "api" for exposure in servers):
        found.append(api_finding(env))
    return [f for f in found if f is not None]


_SAID: set[str] = set()


def announce(command: str, environ: Mapping[str, str] | None = None) -> None:
    """The hook's line, once per process, as ``command`` starts listening (nothing is changed)."""
    from ..console import say

    for finding in exposure_findings(environ, (command,)):
        if finding.code not in _SAID:
            _SAID.add(finding.code)
            say(finding.line())


def wrap_server_entry(entry: Callable[..., Any], command: str) -> Callable[..., Any]:
    """``run_web_ui``/``run_web_demo``/``run_api`` unchanged, after the exposure line (read at call time,
    just before LLaMA-Factory reads the same variables)."""

    @wraps(entry)
    def entry_with_notice(*args: Any, **kwargs: Any) -> Any:
        try:
            announce(command)
        except Exception as exc:  # never keep LLaMA-Factory's server from starting
            from ..console import say

            say(f"exposure not checked ({type(exc).__name__}: {exc}).")
        return entry(*args, **kwargs)

    entry_with_notice.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return entry_with_notice
