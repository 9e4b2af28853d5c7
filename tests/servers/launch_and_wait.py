"""Driver for the no-orphan tests: launch a toy server (with a grandchild) the way replaybench does, then wait.

    python tests/servers/launch_and_wait.py PORT LOG {with|atexit}

`with` stops the server from a `with` block (the path Ctrl-C takes); `atexit` leaves it to the exit hook.
Prints READY once the server answers; the test then signals this process.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.servers import ServerProcess, ServerSpec
from harness.servers.cleanup import termination_signals_raise

TOY = str(Path(__file__).with_name("toy_server.py"))


def main() -> None:
    port, log, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    spec = ServerSpec(
        label="baseline",
        argv=(sys.executable, TOY, str(port), "--spawn-child"),
        port=port,
        ready_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=30,
        stop_grace_s=2,
    )
    server = ServerProcess(spec, log)
    with termination_signals_raise():
        if mode == "with":
            with server:
                server.wait_ready()
                print("READY", flush=True)
                time.sleep(600)
        server.start()
        server.wait_ready()
        print("READY", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
