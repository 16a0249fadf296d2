"""A webhook endpoint in a process of its own (so it can run inside a network namespace): each POST's JSON body is
appended as one line to OUTFILE. ``python hook_server.py PORT OUTFILE``; it serves until killed."""

from __future__ import annotations

import http.server
import sys

PORT, OUT = int(sys.argv[1]), sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(OUT, "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
