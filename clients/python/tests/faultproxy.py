"""A small HTTP proxy in front of the real gateway that fails requests on purpose."""
import http.client
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultProxy:
    """
    `plan(method, path, nth)` says what to do with the nth request (1-based) of that
    method and path (query left out): "forward", "unavailable" (503 without forwarding),
    "served_then_unavailable" (forwarded, then a 503 instead of the answer),
    "served_then_drop" (forwarded, then the connection closed with no answer), or
    ("cut_after_events", N) (an event stream closed after N events).
    """

    def __init__(self, upstream: str, plan=lambda method, path, nth: "forward", retry_after: str = "0"):
        self.upstream = urlsplit(upstream)
        self.plan = plan
        self.retry_after = retry_after
        self.seen = Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_any(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                key = (self.command, self.path.split("?")[0])
                proxy.seen[key] += 1
                action = proxy.plan(self.command, key[1], proxy.seen[key])
                if action == "unavailable":
                    return self.unavailable()
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                resp = upstream.getresponse()
                if action == "served_then_unavailable":
                    resp.read()
                    return self.unavailable()
                if action == "served_then_drop":
                    resp.read()
                    self.close_connection = True
                    return
                cut_after = action[1] if isinstance(action, tuple) else None
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "keep-alive"):
                        self.send_header(k, v)
                self.send_header("connection", "close")  # the body ends when the connection does
                self.end_headers()
                events = 0
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    events += chunk.count(b"\n\n")
                    if cut_after is not None and events >= cut_after:
                        break
                self.close_connection = True
                upstream.close()

            def unavailable(self):
                body = json.dumps({"error": {"code": "unavailable", "message": "injected by the test proxy"}}).encode()
                self.send_response(503)
                self.send_header("content-type", "application/json")
                self.send_header("retry-after", proxy.retry_after)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
