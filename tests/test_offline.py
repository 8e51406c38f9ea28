"""The suite and the data loading make no network connection."""

import socket

import pytest

from tests.conftest import NETWORK_ATTEMPTS


def test_audit_hook_refuses_and_records_a_non_loopback_connect():
    before = len(NETWORK_ATTEMPTS)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.1)
        with pytest.raises(ConnectionRefusedError, match="not allowed"):
            sock.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed
    with pytest.raises(ConnectionRefusedError):
        socket.getaddrinfo("huggingface.co", 443)
    assert len(NETWORK_ATTEMPTS) == before + 2
    del NETWORK_ATTEMPTS[before:]


def test_audit_hook_allows_loopback():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=1):
            pass


def test_loading_the_corpus_from_a_cold_cache_makes_no_network_access(tmp_path, monkeypatch):
    import datasets

    from companion import data

    # A cold cache forces datasets to build the dataset from the files, the path that could ping the hub.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    before = len(NETWORK_ATTEMPTS)
    corpus = data.shakespeare_corpus(genre="tragedy")
    assert len(corpus) == 6
    assert NETWORK_ATTEMPTS[before:] == []

