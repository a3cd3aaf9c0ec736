#!/usr/bin/env python3
"""An agentmesh agent in plain Python: the `word-counter-py` agent.

It serves one skill, `count_words`, over HTTP as docs/agents.md describes,
registers itself with discovery over REST, sends a heartbeat at the
interval discovery asks for, and removes its registration when stopped
with SIGINT (Ctrl-C) or SIGTERM.

    python3 agent.py [--port 0] [--discovery http://127.0.0.1:7400]

Standard library only. Exit status: 0 after a clean stop, 1 when discovery
cannot be reached or refuses the registration at start (or the
registration could not be removed at the end), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AGENT_ID = "word-counter-py"
SKILL_ID = "count_words"
SKILL_PATH = f"/skills/{SKILL_ID}"

# The capability as the planner sees it. The executor checks every answer
# against output_schema.
SKILL = {
    "id": SKILL_ID,
    "description": "Counts the words in a text",
    "input_schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "output_schema": {
        "type": "object",
        "properties": {"words": {"type": "integer"}},
        "required": ["words"],
    },
}

MAX_BODY_BYTES = 1 << 20
# Answers remembered per Idempotency-Key (the executor delivers at least
# once, so a repeated key gets the first answer again).
REMEMBERED_ANSWERS = 1000
DEFAULT_HEARTBEAT_SECS = 10.0
HTTP_TIMEOUT_SECS = 5.0


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --- the skill ---------------------------------------------------------------


class AnswerCache:
    """Answers by Idempotency-Key, the oldest forgotten first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._answers: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._answers.get(key)

    def put(self, key: str, body: bytes) -> None:
        with self._lock:
            self._answers[key] = body
            while len(self._answers) > self._size:
                self._answers.popitem(last=False)


class SkillHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every answer has a Content-Length
    server_version = "word-counter-py"
    answers = AnswerCache(REMEMBERED_ANSWERS)

    def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
        path = urllib.parse.urlsplit(self.path).path
        if path != SKILL_PATH:
            self._discard_body()
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no capability at {path}", "retryable": False})
            return

        execution = self.headers.get("x-agentmesh-execution-id")
        if execution:
            step = "{}/{} attempt {}".format(
                execution,
                self.headers.get("x-agentmesh-step-id", "?"),
                self.headers.get("x-agentmesh-attempt", "?"),
            )
        else:
            step = "(called directly)"
        instruction = urllib.parse.unquote(self.headers.get("x-agentmesh-instruction", ""))

        key = self.headers.get("idempotency-key")
        if key:
            earlier = self.answers.get(key)
            if earlier is not None:
                self._discard_body()
                log(f"{SKILL_ID} {step}: repeated key {key}, the first answer again")
                self._send_bytes(HTTPStatus.OK, earlier)
                return

        text, problem = self._read_text()
        if problem is not None:
            log(f"{SKILL_ID} {step}: refused: {problem}")
            self._send(HTTPStatus.BAD_REQUEST, {"error": problem, "retryable": False})
            return

        words = len(text.split())
        body = json.dumps({"words": words}).encode()
        if key:
            self.answers.put(key, body)
        suffix = f" ({instruction})" if instruction else ""
        log(f"{SKILL_ID} {step}: {words} words{suffix}")
        self._send_bytes(HTTPStatus.OK, body)

    def _read_text(self) -> tuple[str, str | None]:
        """The `text` parameter of the body, or why the body is refused."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.close_connection = True
            return "", "a chunked body is not accepted; send Content-Length"
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            self.close_connection = True
            return "", "Content-Length is not a number"
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return "", f"the body must be at most {MAX_BODY_BYTES} bytes"
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return "", "the body is empty; send a JSON object with `text`"
        try:
            params = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return "", f"the body is not JSON: {err}"
        if not isinstance(params, dict):
            return "", "the body must be a JSON object"
        text = params.get("text")
        if not isinstance(text, str):
            return "", "`text` is required and must be a string"
        return text, None

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if 0 < length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        elif length != 0:
            self.close_connection = True

    def _send(self, status: HTTPStatus, payload: dict) -> None:
        self._send_bytes(status, json.dumps(payload).encode())

    def _send_bytes(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # one line per call is logged by do_POST instead


# --- discovery -----------------------------------------------------------------


class DiscoveryError(Exception):
    """Discovery could not be reached or refused a request."""


class DiscoveryUnreachable(DiscoveryError):
    """Discovery could not be reached."""


class Discovery:
    """The REST calls an agent makes to discovery."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
        """(status, JSON body) of the answer; raises DiscoveryError when unreachable."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECS) as response:
                return response.status, _json_or_none(response.read())
        except urllib.error.HTTPError as err:
            return err.code, _json_or_none(err.read())
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise DiscoveryUnreachable(f"cannot reach discovery at {self.base_url}: {reason}") from err

    def register(self, document: dict) -> None:
        status, body = self._call("POST", "/api/v1/agents", document)
        if status not in (200, 201):
            raise DiscoveryError(f"discovery refused the registration ({status}): {_describe(body)}")

    def heartbeat(self, agent_id: str) -> tuple[int, dict | None]:
        return self._call("POST", f"/api/v1/agents/{urllib.parse.quote(agent_id, safe='')}/heartbeat")

    def deregister(self, agent_id: str) -> int:
        status, body = self._call("DELETE", f"/api/v1/agents/{urllib.parse.quote(agent_id, safe='')}")
        if status not in (204, 404):
            raise DiscoveryError(f"discovery refused the removal ({status}): {_describe(body)}")
        return status


def _json_or_none(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _describe(body: dict | None) -> str:
    if not body:
        return "no details"
    text = f"{body.get('error', '?')}: {body.get('message', '')}"
    if body.get("details"):
        text += f" {json.dumps(body['details'])}"
    return text


def heartbeat_loop(discovery: Discovery, document: dict, stop: threading.Event) -> None:
    """Heartbeats at discovery's interval until stopped; registers again after a 404."""
    interval = DEFAULT_HEARTBEAT_SECS
    while not stop.wait(interval):
        try:
            status, body = discovery.heartbeat(AGENT_ID)
            if status == 404:
                if stop.is_set():
                    return  # deregistered on purpose meanwhile
                log("discovery does not know this agent any more: registering again")
                discovery.register(document)
            elif status == 200 and body:
                interval = float(body.get("heartbeat_interval_seconds") or interval)
            else:
                log(f"heartbeat answered {status}: {_describe(body)}")
        except DiscoveryError as err:
            # Discovery may be restarting; the next heartbeat tries again.
            log(f"heartbeat failed: {err}")


# --- main ------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description="The word-counter-py agent: serves count_words.")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, on 127.0.0.1 (default 0: any free port)")
    parser.add_argument(
        "--discovery",
        default=os.environ.get("AGENTMESH_DISCOVERY_URL", "http://127.0.0.1:7400"),
        help="discovery's HTTP address (default: $AGENTMESH_DISCOVERY_URL or http://127.0.0.1:7400)",
    )
    args = parser.parse_args()
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    discovery_url = args.discovery if "://" in args.discovery else f"http://{args.discovery}"

    try:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), SkillHandler)
    except OSError as err:
        print(f"error: cannot listen on 127.0.0.1:{args.port}: {err}", file=sys.stderr)
        return 1
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    document = {
        "id": AGENT_ID,
        "base_url": base_url,
        "transport": "http",
        "skills": [SKILL],
    }

    stop = threading.Event()
    # Both signals are one request to stop; the main thread does the rest.
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    discovery = Discovery(discovery_url)
    try:
        discovery.register(document)
    except DiscoveryError as err:
        server.server_close()
        print(f"error: {err}", file=sys.stderr)
        if isinstance(err, DiscoveryUnreachable):
            print("error: is the mesh running? Start it with `agentmesh demo --serve` or `agentmesh up`.", file=sys.stderr)
        return 1

    serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    serving.start()
    beating = threading.Thread(target=heartbeat_loop, args=(discovery, document, stop), name="heartbeat", daemon=True)
    beating.start()
    print(f"{AGENT_ID} serving {SKILL_ID} at {base_url}{SKILL_PATH}, registered with {discovery.base_url}", flush=True)

    while not stop.wait(0.5):
        pass

    # Leave the registry first, so that nothing is routed here any more; a
    # heartbeat still in flight must not register the agent again after it.
    beating.join(timeout=2 * HTTP_TIMEOUT_SECS + 1)
    status = 0
    try:
        if discovery.deregister(AGENT_ID) == 404:
            log("the registration was already gone")
        print(f"{AGENT_ID} deregistered", flush=True)
    except DiscoveryError as err:
        print(f"error: could not deregister: {err}", file=sys.stderr)
        status = 1
    server.shutdown()
    server.server_close()
    return status


if __name__ == "__main__":
    sys.exit(main())
