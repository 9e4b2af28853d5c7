"""A minimal HTTP server process for lifecycle tests: the behaviours a real inference server can show.

    python tests/servers/toy_server.py PORT [--env-out FILE] [--spawn-child] [--ignore-term]
                                            [--exit-code N] [--start-delay S]

Serves GET /health (200) and GET /metrics (a counter of requests served). `--spawn-child` forks a long
sleeping grandchild (like vLLM's engine process) to prove the whole process group is stopped;
`--ignore-term` ignores SIGTERM so only SIGKILL stops it; `--exit-code N` prints a line and exits at once.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import time


class _Handler(http.server.BaseHTTPRequestHandler):
    served = 0

    def do_GET(self) -> None:
        _Handler.served += 1
        if self.path == "/health":
            body = b"ok"
        elif self.path == "/metrics":
            body = f"toy_requests_total {_Handler.served}\n".encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--env-out")
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    print(f"toy server starting on {args.port}", flush=True)
    if args.exit_code is not None:
        print("fatal: toy server cannot start (as asked)", flush=True)
        sys.exit(args.exit_code)
    if args.env_out:
        with open(args.env_out, "w") as out:
            out.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>") + "\n" + os.environ.get("TOY_VAR", ""))
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(args.start_delay)
    http.server.HTTPServer(("127.0.0.1", args.port), _Handler).serve_forever()


if __name__ == "__main__":
    main()
