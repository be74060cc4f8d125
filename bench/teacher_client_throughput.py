"""Throughput of the openai teacher client against a local zero-latency OpenAI-compatible server.

Requests/s and client CPU time per request with 1, 64 and 256 requests in flight (the generation
driver and OpenAITeacher, records kept in memory; plus one row with the real fsync'ed shard writer),
next to a plain sequential httpx loop sending the same bodies, in the same run. The server is a
minimal ASGI app under uvicorn in its own process, so its CPU is not counted. Prints numbers only.

    python bench/teacher_client_throughput.py [--requests 2000]
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REPLY = json.dumps(
    {
        "id": "x",
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": "<think>2 + 2 = 4.</think>\nThe answer is \\boxed{4}.",
                },
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 14},
    }
).encode()

SERVER = f"""
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json")]
    await send({{"type": "http.response.start", "status": 200, "headers": headers}})
    await send({{"type": "http.response.body", "body": {REPLY!r}}})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def problems(n: int) -> list[dict]:
    from stillroom.data.sources import generate

    return generate("arithmetic", "bench", n, seed=0, max_operand=1000)


def run_driver(url: str, rows: list[dict], concurrency: int, sink) -> tuple[float, float]:
    from stillroom.stages.generate import _drive
    from stillroom.teachers import make_teacher

    teacher = make_teacher(
        "bench",
        {
            "backend": "openai",
            "base_url": url,
            "model": "bench",
            "concurrency": concurrency,
            "sampling": {"max_tokens": 64},
        },
    )
    pending = [(p, 0, "medium") for p in rows]
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(_drive(teacher, pending, 0, sink, lambda _: None))
    return time.perf_counter() - wall, time.process_time() - cpu


def run_plain(url: str, rows: list[dict]) -> tuple[float, float]:
    import httpx

    from stillroom.teachers import make_teacher

    teacher = make_teacher(
        "bench",
        {"backend": "openai", "base_url": url, "model": "bench", "sampling": {"max_tokens": 64}},
    )
    bodies = [teacher.request_body(p, "medium", 0, 0) for p in rows]
    wall, cpu = time.perf_counter(), time.process_time()
    with httpx.Client(base_url=url) as client:
        for body in bodies:
            client.post("/chat/completions", json=body).json()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "zero_server.py").write_text(SERVER)
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "zero_server:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            cwd=tmp,
        )
        url = f"http://127.0.0.1:{port}/v1"
        try:
            import httpx

            for _ in range(100):
                try:
                    httpx.post(url + "/chat/completions", json={})
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            rows = problems(args.requests)
            results = [("plain sequential httpx loop", 1, *run_plain(url, rows))]
            for c in (1, 64, 256):
                results.append(
                    (
                        "stillroom driver, in-memory records",
                        c,
                        *run_driver(url, rows, c, lambda r: None),
                    )
                )
            with open(Path(tmp) / "shard.partial", "a") as fh:

                def fsynced(rec):
                    fh.write(json.dumps(rec) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())

                results.append(
                    ("stillroom driver, fsync per record", 64, *run_driver(url, rows, 64, fsynced))
                )
        finally:
            server.terminate()
            server.wait()
    base = results[0][2]
    print(
        f"{args.requests} requests to a local zero-latency server (uvicorn, own process); "
        "2-core machine"
    )
    print(f"{'client':<38}{'in flight':>10}{'req/s':>9}{'CPU ms/req':>12}{'vs plain':>10}")
    for name, c, wall, cpu in results:
        print(
            f"{name:<38}{c:>10}{args.requests / wall:>9.0f}{1000 * cpu / args.requests:>12.2f}"
            f"{base / wall:>9.2f}x"
        )


if __name__ == "__main__":
    main()
