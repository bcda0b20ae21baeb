"""`entrypoint status` against an endpoint whose label values hold terminal escapes and run on:
the table and the JSON show them escaped and cut, never raw (the values are what nodes said of
themselves). A real HTTP server on loopback serves the text."""

import http.server
import json
import subprocess
import sys
import threading

import pytest

HOSTILE = "\x1b[2J\x1b]0;pwned\x07"
METRICS = (
    f'multinode_job_info{{job="\x1b[31mred",platform="torchrun"}} 1.0\n'
    'multinode_job_phase{phase="run"} 1.0\n'
    f'multinode_node_up{{node="0",host="{HOSTILE}"}} 1.0\n'
    f'multinode_node_state{{node="0",host="{HOSTILE}",state="training"}} 1.0\n'
    f'multinode_node_up{{node="1",host="{"h" * 500}"}} 1.0\n'
    f'multinode_rank_steps{{node="0",host="{HOSTILE}",rank="0"}} 5.0\n'
)


@pytest.fixture
def endpoint():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("form", ["--once", "--json"])
def test_label_values_are_escaped_and_cut(endpoint, form):
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "status", endpoint, form],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1), out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "x1b" in out.stdout  # shown, escaped
    assert "h" * 70 not in out.stdout  # 500 characters cut
    if form == "--json":
        job = json.loads(out.stdout)
        assert job["members"][0]["host"].startswith("'\\x1b[2J")
