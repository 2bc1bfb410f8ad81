"""A class pressing "Run it here" together, against the real server (no mocked replies).

Ten students open the MLA page on the teacher's server, each at their own context length (so each asks for a
job of its own: nothing is answered from the server's cache), and all press "Run it here" at once.
They come from one address (a classroom behind one router looks the same), so beyond the server's per-client
share they get 429 with Retry-After, and beyond its queue 503: every page must say what is happening and get its
own measurement by itself, without a second click. test_phone.py checks each state's wording with mocked
replies; this checks that the real server and the real page agree on them.
"""
from __future__ import annotations

import re
import socket
import threading
import time

import pytest
import uvicorn

from kvx.compute.app import create_app
from kvx.compute.settings import Settings

STUDENTS = 10
CONTEXTS = [1024 + 128 * i for i in range(STUDENTS)]      # a job of its own each


@pytest.fixture
def classroom_server(built_site):
    """The teacher's laptop: a server with a short kernel queue (one running, two waiting, one place per
    address), so ten presses at once are sure to meet 429 and 503 however fast the kernel is."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(site_dir=built_site, kernel_queue=2, kernel_per_client=1)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_ten_students_all_get_their_own_answer_without_a_second_click(browser, classroom_server):
    site_url = classroom_server
    contexts, pages = [], []
    try:
        for ctx_len in CONTEXTS:
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            ctx.route(re.compile(r"^(?!http://127\.0\.0\.1)"), lambda route: route.abort())   # offline, as in class
            contexts.append(ctx)
            page = ctx.new_page()
            page.goto(f"{site_url}/mla.html?context={ctx_len}")
            pages.append(page)
        for page in pages:
            page.wait_for_function("Bokeh.documents.length && !Bokeh.documents[0].get_model_by_name('run:button')"
                                   ".disabled", timeout=120_000)
            page.wait_for_selector("html[data-py-ready]", state="attached", timeout=120_000)
        # Every press at the same moment: one click after another from here took long enough on a loaded host
        # (Playwright checks each button before it clicks) for the kernel to finish each job before the next
        # came, and no student had to wait. Each page clicks its own button, as the reader's press does.
        buttons = [page.get_by_role("button", name=re.compile("Run it here")).element_handle() for page in pages]
        at = time.time() * 1000 + 1500
        for button in buttons:
            button.evaluate("(el, at) => setTimeout(() => el.click(), at - Date.now())", at)
        retries = []
        for page in pages:
            page.wait_for_function("['failed', 'done'].includes(document.documentElement.dataset.kvxRunState)"
                                   " && Number(document.documentElement.dataset.kvxRun || 0) > 0"
                                   " || document.documentElement.dataset.kvxRunState === 'failed'", timeout=240_000)
            retries.append(int(page.evaluate("document.documentElement.dataset.kvxRetries || '0'")))
        for page, ctx_len in zip(pages, CONTEXTS):
            assert page.evaluate("document.documentElement.dataset.kvxRunState") == "done"
            text = page.evaluate("kvx.text('run_result')")
            assert text.startswith("Measured on"), text
            assert f"{ctx_len:,} cached tokens" in text, (ctx_len, text)    # its own job, not a neighbour's
        # The class did contend: pages were told to wait (429/503 with Retry-After) and retried by themselves.
        print(f"retries per student: {retries}")
        assert sum(retries) > 0, retries
    finally:
        for ctx in contexts:
            ctx.close()
