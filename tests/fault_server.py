"""A fault-injection OpenAI-compatible server for tests (127.0.0.1, a thread per connection).

It answers /v1/chat/completions and /v1/completions deterministically from the prompt, and before
answering injects faults at configured rates: HTTP 500, 429 with Retry-After, malformed JSON, a
reset connection, or a slow response. It counts every request and fault so tests can check
exactness.
"""

import json
import os
import random
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("error500", "rate429", "malformed", "reset", "slow")


class FaultServer:
    def __init__(
        self,
        rates: dict[str, float] | None = None,
        seed: int = 0,
        slow_s: float = 1.0,
        retry_after: str = "0",
        delay_s: float = 0.0,
        model_info: dict | None = None,
        refuse_fields: tuple[str, ...] = (),
    ):
        self.rates = {f: (rates or {}).get(f, 0.0) for f in FAULTS}
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.slow_s, self.retry_after, self.delay_s = slow_s, retry_after, delay_s
        self.model_info = model_info  # SGLang's /get_model_info, when set
        # request fields it does not take, answered with 400 as a strict server does
        self.refuse_fields = refuse_fields
        self.counts = {f: 0 for f in FAULTS} | {"requests": 0, "ok": 0}
        self.bodies: list[dict] = []
        self.bodies_path = os.environ.get("FAULT_SERVER_BODIES")  # each body also appended there
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: (
            None
        )  # clients hanging up on injected faults
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _draw(self) -> str | None:
        with self.lock:
            self.counts["requests"] += 1
            roll = self.rng.random()
            for fault in FAULTS:
                if roll < self.rates[fault]:
                    self.counts[fault] += 1
                    return fault
                roll -= self.rates[fault]
            self.counts["ok"] += 1
            return None

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(
                self, status: int, payload: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                if self.path.rstrip("/") in ("/health", "/v1/models"):
                    return self._send(200, b'{"status": "ok"}')
                if self.path == "/get_model_info" and server.model_info:
                    return self._send(200, json.dumps(server.model_info).encode())
                self._send(404, b'{"error": "not found"}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                refused = [f for f in server.refuse_fields if f in body]
                if refused:
                    with server.lock:
                        server.counts["requests"] += 1
                    return self._send(400, json.dumps({"error": f"unknown {refused}"}).encode())
                fault = server._draw()
                if fault == "reset":  # RST instead of a response
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                    return
                if fault == "error500":
                    return self._send(500, b'{"error": "injected"}')
                if fault == "rate429":
                    return self._send(
                        429, b'{"error": "slow down"}', {"Retry-After": server.retry_after}
                    )
                if fault == "malformed":
                    return self._send(200, b'{"choices": [{"message": ')
                time.sleep(server.slow_s if fault == "slow" else server.delay_s)
                with server.lock:
                    server.bodies.append(body)
                    if server.bodies_path:  # for a test that started this server as a process
                        with open(server.bodies_path, "a") as fh:
                            fh.write(json.dumps(body) + "\n")
                prompt = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
                numbers = [int(n) for n in re.findall(r"\d+", prompt)]
                text = (
                    f"<think>Adding up {numbers}.</think>\nThe answer is \\boxed{{{sum(numbers)}}}."
                )
                choice = (
                    {"message": {"role": "assistant", "content": text}}
                    if "messages" in body
                    else {"text": text}
                ) | {"index": 0, "finish_reason": "stop"}
                payload = {
                    "id": "x",
                    "model": body["model"] + "-served",
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(prompt.split()),
                        "completion_tokens": len(text.split()),
                    },
                }
                self._send(200, json.dumps(payload).encode())

        return Handler


if (
    __name__ == "__main__"
):  # a stand-in for a served model: python tests/fault_server.py PORT [STARTUP_DELAY_S [WEIGHTS]]
    import sys

    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    weights = sys.argv[3] if len(sys.argv) > 3 else None
    server = FaultServer(
        model_info={"model_path": weights, "is_generation": True} if weights else None
    )
    server.httpd.server_close()
    server.httpd = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), server._handler())
    server.httpd.serve_forever()
