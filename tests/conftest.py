"""Test-wide fixtures: every test runs with the network audited.

An audit hook (PEP 578) sees every ``socket.connect`` and ``socket.getaddrinfo`` made by Python
code in this process. Any destination outside the loopback range is recorded and refused with
``ConnectionRefusedError``; at the end of the session any attempt fails the run (tests that
make one on purpose, in ``tests/test_offline.py``, remove their own records).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

import pytest
import torch

# Offline before anything imports `datasets` or `huggingface_hub`.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")

NETWORK_ATTEMPTS: list[str] = []
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def _is_loopback(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).split("%")[0]
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost would need DNS: not allowed


def _audit(event: str, args: tuple) -> None:
    if event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            NETWORK_ATTEMPTS.append(f"connect to {address}")
            raise ConnectionRefusedError(f"network access is not allowed in tests: connect to {address}")
    elif event == "socket.getaddrinfo":
        host = args[0]
        if not _is_loopback(host):
            NETWORK_ATTEMPTS.append(f"DNS lookup of {host!r}")
            raise ConnectionRefusedError(f"network access is not allowed in tests: DNS lookup of {host!r}")


sys.addaudithook(_audit)  # audit hooks cannot be removed: it stays for the whole session


def pytest_sessionfinish(session, exitstatus):
    """Fail the whole run if any test (or the code it called) tried to reach the network."""
    if NETWORK_ATTEMPTS:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("network access attempted during the tests:", red=True)
            for attempt in NETWORK_ATTEMPTS:
                reporter.write_line(f"  {attempt}", red=True)
        session.exitstatus = 1


@pytest.fixture
def one_thread():
    """One PyTorch thread for the test (tiny models only lose from threads, and CI's two cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
