"""No open door by surprise: the exposure line, against LLaMA-Factory's own source and the real server's socket.

Oracles: the installed LLaMA-Factory's source lines that lf/exposure.py restates (they cannot be called),
and the kernel's answer to where the real ``llamafactory-cli webui`` listens (psutil reads the process's
sockets). Runs on both lines (0.9.5 and main; tests/main_line.sh).
"""

from __future__ import annotations

import ast
import importlib.util
import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llamafactory_rocm.lf import exposure
from llamafactory_rocm.lf.v1_launcher import NOT_CHECKED
from tests.conftest import offline_env

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")


def lf_function_source(module: str, function: str) -> str:
    """A function's source from the installed LLaMA-Factory, read without importing it (no gradio needed)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not installed"
    text = Path(spec.origin).read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"{module}.{function} not found: lf/exposure.py restates a line that moved")


@pytest.mark.parametrize("function", ["run_web_ui", "run_web_demo"])
def test_the_gradio_lines_restated_are_llamafactorys(function):
    source = lf_function_source("llamafactory.webui.interface", function)
    assert 'gradio_ipv6 = is_env_enabled("GRADIO_IPV6")' in source
    assert 'gradio_share = is_env_enabled("GRADIO_SHARE")' in source
    assert 'server_name = os.getenv("GRADIO_SERVER_NAME", "[::]" if gradio_ipv6 else "0.0.0.0")' in source
    launch = source[source.index(".launch(") :]
    assert "share=gradio_share, server_name=server_name" in launch
    assert "auth" not in launch  # no password, ever: gradio's launch(auth=None)


def test_the_api_lines_restated_are_llamafactorys():
    assert 'api_host = os.getenv("API_HOST", "0.0.0.0")' in lf_function_source("llamafactory.api.app", "run_api")
    app = lf_function_source("llamafactory.api.app", "create_app")
    assert 'api_key = os.getenv("API_KEY")' in app
    assert "if api_key and (auth is None or auth.credentials != api_key)" in app  # an empty key checks nothing


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("[::]", False), ("10.0.0.5", False), ("my-box.example", False)],
)  # fmt: skip
def test_loopback_is_ipaddress_own_answer(host, loopback):
    assert exposure.is_loopback(host) is loopback
    if host.strip("[]") not in {"localhost", "my-box.example"}:
        assert ipaddress.ip_address(host.strip("[]")).is_loopback is loopback


def test_gradio_share_is_read_by_llamafactorys_is_env_enabled():
    """GRADIO_SHARE=true/y/1 count (LLaMA-Factory's is_env_enabled), yes does not; this process's env is kept."""
    from llamafactory.extras.misc import is_env_enabled

    before = dict(os.environ)
    for value in ("1", "true", "Y", "yes", "0"):
        os.environ["GRADIO_SHARE"] = value
        expected = is_env_enabled("GRADIO_SHARE")
        os.environ.pop("GRADIO_SHARE")
        found = exposure.exposure_findings({"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SHARE": value}, ("webui",))
        assert bool(found) is expected, value
    assert dict(os.environ) == before


def test_the_api_with_a_key_or_on_the_loopback_is_not_exposed():
    assert [f.code for f in exposure.exposure_findings({}, ("api",))] == ["API_EXPOSED"]
    assert exposure.exposure_findings({"API_KEY": "s3cret"}, ("api",)) == []
    assert [f.code for f in exposure.exposure_findings({"API_KEY": ""}, ("api",))] == ["API_EXPOSED"]
    assert exposure.exposure_findings({"API_HOST": "127.0.0.1"}, ("api",)) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(pid: int, port: int) -> list[str]:
    """The addresses the process tree listens on at ``port``, from the kernel (psutil)."""
    found = []
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        conns = proc.net_connections("inet") if hasattr(proc, "net_connections") else proc.connections("inet")
        found += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    return found


def start_webui(tmp_path: Path, port: int, **extra: str) -> tuple[subprocess.Popen, Path]:
    """Stock ``llamafactory-cli webui`` on ``port``; BROWSER=true: its launch(inbrowser=True) opens nothing."""
    env = offline_env(tmp_path, GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False", BROWSER="true")
    for key in ("GRADIO_SERVER_NAME", "GRADIO_SHARE", "GRADIO_IPV6"):
        env.pop(key, None)
    env.update(extra)
    log = tmp_path / f"webui-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [LLAMAFACTORY_CLI, "webui"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return proc, log


def wait_served(proc: subprocess.Popen, log: Path, port: int, timeout: float = 180) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"webui stopped ({proc.returncode}): {log.read_text()[-3000:]}"
        addresses = _listening(proc.pid, port)
        if addresses:
            return addresses
        time.sleep(0.5)
    raise AssertionError(f"webui never listened on {port}: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("server_name", [None, "127.0.0.1"])
def test_a_webui_beyond_the_loopback_says_so_once_and_one_on_the_loopback_does_not(tmp_path, server_name):
    assert importlib.util.find_spec("gradio"), "LlamaBoard needs the webui extra: pip install -e '.[webui]'"
    port = _free_port()
    extra = {"GRADIO_SERVER_NAME": server_name} if server_name else {}
    proc, log = start_webui(tmp_path, port, **extra)
    try:
        addresses = wait_served(proc, log, port)
    finally:
        stop(proc)
    text = log.read_text()
    exposed = not all(ipaddress.ip_address(a).is_loopback for a in addresses)  # the kernel's answer
    assert exposed is (server_name is None), addresses
    said = [line for line in text.splitlines() if "LLAMABOARD_EXPOSED" in line]
    assert len(said) == (1 if exposed else 0), text[-3000:]
    if exposed:
        assert said[0].startswith("llamafactory-rocm: [warning] LLAMABOARD_EXPOSED: LlamaBoard listens on 0.0.0.0")
        assert "GRADIO_SERVER_NAME=127.0.0.1" in said[0] and f"ssh -L {port}:127.0.0.1:{port}" in said[0]


def test_the_off_switch_silences_the_exposure_line(tmp_path):
    """LLAMAFACTORY_ROCM=0 is off: the server entries are not wrapped."""
    code = "from llamafactory.api import app\nprint('WRAPPED', getattr(app.run_api, '__llamafactory_rocm__', False))\n"
    env = offline_env(tmp_path)
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "LLAMAFACTORY_ROCM": "0"}, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert "No module named" not in on.stderr, "the API needs the webui extra: pip install -e '.[webui]'"
    assert "WRAPPED True" in on.stdout, on.stderr[-2000:]
    assert "WRAPPED False" in off.stdout, off.stderr[-2000:]


def test_the_v1_launcher_says_it_is_not_checked(tmp_path):
    """USE_V1=1 routes llamafactory-cli to llamafactory.v1.launcher (cli.py main), which never calls run_exp."""
    env = offline_env(tmp_path, USE_V1="1")
    v1 = subprocess.run([LLAMAFACTORY_CLI, "sft", str(tmp_path / "absent.yaml")], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert [line for line in v1.stderr.splitlines() if NOT_CHECKED in line] == [f"llamafactory-rocm: {NOT_CHECKED}"]
    assert f"llamafactory{os.sep}v1{os.sep}" in v1.stderr, v1.stderr[-2000:]  # v1's code took the run, whatever it did
    env.pop("USE_V1")
    v0 = subprocess.run([LLAMAFACTORY_CLI, "help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert v0.returncode == 0 and NOT_CHECKED not in v0.stderr
