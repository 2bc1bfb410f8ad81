"""Fixtures for the compute server's tests."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time

import pytest
import uvicorn


@contextlib.contextmanager
def serving(app):
    """The app under uvicorn on a free loopback port (for what needs a real connection); yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def serve():
    return serving


def _run_in_own_thread(coroutine):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@pytest.fixture
def run_async():
    """asyncio.run in a thread of its own: after the browser tests, Playwright's sync API keeps an event
    loop running in the main thread for the session, and asyncio.run refuses to start inside it."""
    return _run_in_own_thread


@pytest.fixture(scope="session", autouse=True)
def fused_kernels_built():
    """The fused CPU kernels, built as `make setup` builds them (the server only loads them); a machine without
    a C compiler runs the PyTorch kernels, and the fused kernel's own tests skip."""
    try:
        from kvx.site.native import build_all
    except ImportError:                          # no PyTorch: no kernels
        return
    build_all()
