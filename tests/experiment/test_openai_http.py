"""The model lookup names what went wrong: a server that answers without a model list, or no server at all."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.errors import UserError
from harness.experiment.openai_http import first_model


@contextmanager
def models_server(status: int, body: object) -> Iterator[str]:
    """A loopback server answering every GET with ``status`` and ``body`` as JSON."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_first_listed_model_is_returned() -> None:
    with models_server(200, {"data": [{"id": "nemotron"}, {"id": "other"}]}) as url:
        assert first_model(url + "/") == "nemotron"


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [(404, {"detail": "Not Found"}, "lists no model (HTTP 404); set the arm's `model`"),
     (200, {"data": []}, "lists no model (IndexError: list index out of range); set the arm's `model`")],
    ids=["not found", "empty list"],
)  # fmt: skip
def test_a_server_without_a_model_list_asks_for_the_arms_model(status: int, body: object, says: str) -> None:
    with models_server(status, body) as url, pytest.raises(UserError) as raised:
        first_model(url)
    assert str(raised.value) == f"{url}/v1/models {says}"


def test_no_server_at_all_asks_to_start_it() -> None:
    with pytest.raises(UserError) as raised:
        first_model("http://127.0.0.1:9", timeout_s=2.0)
    assert str(raised.value).startswith("http://127.0.0.1:9/v1/models did not answer (")
    assert str(raised.value).endswith("start the server or fix the URL")
