#!/usr/bin/env python3
"""Orchestrate a request over REST with server-sent events, printing every
event as it arrives.

POST /api/v1/orchestrate with `Accept: text/event-stream` answers with an
SSE stream: `id:` is the message's sequence, `event:` its kind and `data:`
its JSON form. This client parses the stream by the rules of the SSE
specification (any line ending, comment lines, fields without a value,
multi-line data, an event ends at a blank line) and prints each message on
one line, the same lines client_grpc.py prints. If the connection drops
before the last message, it resumes with Last-Event-ID, as the gateway
allows (docs/api/gateway.md, "Resuming a stream").

    python3 client_rest.py 'Count the words in "the quick brown fox jumps"'
    python3 client_rest.py --gateway http://127.0.0.1:7404 'What is the weather in Chicago?'

Standard library only. The gateway's address comes from --gateway, else
AGENTMESH_GATEWAY_URL, else 127.0.0.1:7404 (`host:port` or an http(s):// URL).

Exit status: 0 when the orchestration ends with a final answer that has
text, after a plan with steps whose execution completed; 1 when it ends
otherwise (an error message, a failed or cancelled execution, a plan with
no steps, an empty answer, a stream that stops early and cannot be
resumed) or the gateway refuses the request; 2 for bad arguments; 130
after Ctrl-C.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import sys
import time
import urllib.parse
from typing import Iterator

MAX_RESUMES = 5


# --- server-sent events ------------------------------------------------------------


class Event:
    """One dispatched server-sent event."""

    def __init__(self, type_: str, data: str, last_id: str) -> None:
        self.type = type_
        self.data = data
        self.id = last_id  # the last event id, as the SSE specification keeps it


class SseParser:
    """The SSE specification's event stream interpretation, fed bytes."""

    _line = re.compile(rb"\r\n|\r|\n")

    def __init__(self) -> None:
        self.last_id = ""  # the id of the last event dispatched: where to resume
        self.retry_ms: int | None = None
        self.new_stream()

    def new_stream(self) -> None:
        """Forgets a partly received event; the last id and retry are kept."""
        self._buffer = b""
        self._started = False
        self._type = ""
        self._data: list[str] = []
        self._id = self.last_id  # the last event id buffer

    def feed(self, chunk: bytes) -> Iterator[Event]:
        """The events completed by chunk."""
        self._buffer += chunk
        while True:
            match = self._line.search(self._buffer)
            # A CR at the very end may be the first half of a CRLF: wait for more.
            if match is None or (match.group() == b"\r" and match.end() == len(self._buffer)):
                return
            raw, self._buffer = self._buffer[: match.start()], self._buffer[match.end() :]
            line = raw.decode("utf-8", errors="replace")
            if not self._started:
                self._started = True
                line = line.removeprefix("\ufeff")
            event = self._process(line)
            if event is not None:
                yield event

    def _process(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: the gateway sends one every 15 s to keep proxies open
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._type = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry":
            if value.isdigit():
                self.retry_ms = int(value)
        # Other fields are ignored.
        return None

    def _dispatch(self) -> Event | None:
        # The id counts from here on, even for an event without data.
        self.last_id = self._id
        type_, data = self._type or "message", self._data
        self._type, self._data = "", []
        if not data:
            return None
        return Event(type_, "\n".join(data), self.last_id)

    # An event not ended by a blank line when the stream ends is dropped, as
    # the specification says (new_stream); the caller resumes after last_id,
    # the last whole one.


# --- printing -------------------------------------------------------------------------


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def oneline(text: str) -> str:
    """Text on one line: line breaks written as \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class Printer:
    """Prints the gateway's messages and tracks how the orchestration ends."""

    def __init__(self) -> None:
        self.steps = 0  # steps of the plan, extensions included
        self.execution_outcome = ""  # the last execution_completed/failed/cancelled
        self.execution_error = ""
        self.zero_step_reason = ""
        self.last_kind = ""
        self.last: dict = {}

    def show(self, kind: str, msg: dict) -> None:
        self.last_kind, self.last = kind, msg
        body = msg.get(kind)
        body = body if isinstance(body, dict) else {}
        prefix = f"#{msg.get('sequence', '?')}" + (f" round {msg['round']}" if msg.get("round") else "")
        if kind == "plan_created":
            text = self.plan_created(body)
        elif kind == "execution_event":
            text = self.execution_event(body)
        elif kind == "synthesis_chunk":
            text = f"answer chunk: {compact(body.get('text', ''))}"
        elif kind == "review":
            text = self.review(body)
        elif kind == "final_answer":
            achieved = "goal achieved" if body.get("goal_achieved") else "goal not achieved"
            execution = f", execution {body['execution_id']}" if body.get("execution_id") else ""
            text = f"final_answer ({achieved}{execution}): {body.get('text', '')}"
        elif kind == "error":
            text = f"error from {body.get('service') or '?'}: {body.get('code', '?')}: {body.get('message', '')}"
        else:
            text = f"{kind}: {compact(msg)}"
        print(f"{prefix} {oneline(text)}", flush=True)

    def plan_created(self, created: dict) -> str:
        plan, stats = created.get("plan") or {}, created.get("stats") or {}
        steps = plan.get("steps") or []
        self.steps = len(steps)
        if not steps:
            self.zero_step_reason = created.get("zero_step_reason") or "no reason given"
            return f"plan_created: no steps: {self.zero_step_reason}"
        calls = stats.get("llm_calls", 0)
        reasoning = f" | reasoning: {plan['reasoning']}" if plan.get("reasoning") else ""
        return (
            f"plan_created: {len(steps)} step{'' if len(steps) == 1 else 's'}: "
            + "; ".join(self.step(s) for s in steps)
            + reasoning
            + f" | {calls} LLM call{'' if calls == 1 else 's'}, model {stats.get('model') or '?'} ({stats.get('provider') or '?'})"
        )

    @staticmethod
    def step(s: dict) -> str:
        after = f" after {', '.join(s['depends_on'])}" if s.get("depends_on") else ""
        return f"{s.get('step_id')} {s.get('agent')}/{s.get('capability')} {compact(s.get('parameters') or {})}{after}"

    def execution_event(self, ev: dict) -> str:
        kind = ev.get("kind", "?")
        if kind.startswith("step_"):
            details = [ev["agent_id"]] if ev.get("agent_id") else []
            if ev.get("attempt"):
                details.append(f"attempt {ev['attempt']}")
            if ev.get("duration_ms"):
                details.append(f"{ev['duration_ms']} ms")
            text = f"{kind} {ev.get('step_id', '')}" + (f" ({', '.join(details)})" if details else "")
            if "output" in ev:
                text += f": {compact(ev['output'])}"
            if ev.get("error"):
                text += f": {ev['error']}"
            if ev.get("retry_delay_ms"):
                text += f"; next attempt in {ev['retry_delay_ms']} ms"
            return text
        if kind in ("execution_completed", "execution_failed", "execution_cancelled"):
            self.execution_outcome, self.execution_error = kind, ev.get("error", "")
        text = f"{kind} {ev.get('execution_id', '')}"
        if ev.get("step_id"):
            text += f" (asked by {ev['step_id']})"
        if ev.get("added_steps"):
            self.steps += len(ev["added_steps"])
            text += ": added " + "; ".join(self.step(s) for s in ev["added_steps"])
        if ev.get("error"):
            text += f": {ev['error']}"
        return text

    @staticmethod
    def review(review: dict) -> str:
        achieved = "goal achieved" if review.get("goal_achieved") else "goal not achieved"
        text = f"review: {achieved}, confidence {float(review.get('confidence', 0)):.2f}: {review.get('summary', '')}"
        if review.get("missing_data"):
            text += f" | missing: {', '.join(review['missing_data'])}"
        for action in review.get("recovery_actions") or []:
            target = action.get("collaboration") or {}
            where = f" {target.get('agent')}/{target.get('capability')}" if target.get("agent") else ""
            text += f" | recovery {action.get('kind', '?')}{where}: {action.get('reason', '')}"
        return text

    def finished(self) -> bool:
        return self.last_kind in ("final_answer", "error")

    def failure(self) -> str | None:
        """Why the orchestration did not end as completed with an answer; None when it did."""
        if self.last_kind == "error":
            err = self.last.get("error") or {}
            return f"the orchestration failed in {err.get('service', '?')}: {err.get('code', '?')}"
        if self.last_kind != "final_answer":
            return "the stream ended before the final answer"
        if self.zero_step_reason and not self.steps:
            return f"nothing was run (the plan has no steps): {self.zero_step_reason}"
        if self.execution_outcome != "execution_completed":
            outcome = self.execution_outcome or "no end of the execution was seen"
            return f"the execution did not complete: {outcome} {self.execution_error}".rstrip()
        if not str((self.last.get("final_answer") or {}).get("text", "")).strip():
            return "the final answer is empty"
        return None


# --- HTTP ---------------------------------------------------------------------------


class GatewayError(Exception):
    """The gateway refused the request, or could not be reached."""


def connect(base: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    cls = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
    return cls(base.hostname, base.port, timeout=timeout)


def open_stream(base, method: str, path: str, body: dict | None, last_id: str, timeout: float):
    """Sends the request; returns (connection, response) once an event stream is answered."""
    headers = {"accept": "text/event-stream", "cache-control": "no-cache"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    if last_id:
        headers["last-event-id"] = last_id
    conn = connect(base, timeout)
    try:
        conn.request(method, base.path.rstrip("/") + path, body=data, headers=headers)
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as err:
        conn.close()
        raise GatewayError(f"cannot reach the gateway at {base.geturl()}: {err}") from err
    content_type = response.getheader("content-type", "")
    if response.status != 200 or not content_type.startswith("text/event-stream"):
        raw = response.read()
        conn.close()
        try:
            err = json.loads(raw)
            detail = f"{err.get('error')}: {err.get('message')}"
        except (ValueError, AttributeError):
            detail = raw[:200].decode("utf-8", "replace") or "(no body)"
        raise GatewayError(f"the gateway answered {response.status} ({content_type or 'no content type'}): {detail}")
    return conn, response


def read_events(response, parser: SseParser) -> Iterator[Event]:
    """Events as they arrive, until the server closes the stream."""
    while True:
        chunk = response.read1(65536)  # whatever has arrived, without waiting for more
        if not chunk:
            return
        yield from parser.feed(chunk)


def follow(base, body: dict, timeout: float, printer: Printer, sse: SseParser) -> str | None:
    """Streams the orchestration, printing each message, and resumes the
    stream when it stops early. None once the last message is in, else why
    the stream stopped before it."""
    request_id = body.get("request_id", "")
    method, path, payload = "POST", "/api/v1/orchestrate", body
    resumes = 0
    while True:
        sse.new_stream()
        try:
            conn, response = open_stream(base, method, path, payload, sse.last_id, timeout)
        except GatewayError as err:
            if method == "POST" or resumes >= MAX_RESUMES:
                raise
            dropped = str(err)
        else:
            if method == "POST":
                request_id = response.getheader("x-request-id") or request_id
                print(f"request id {request_id or '?'}", flush=True)
            try:
                for event in read_events(response, sse):
                    try:
                        msg = json.loads(event.data)
                    except ValueError:
                        print(f"(event {event.type} id {event.id}: data that is not JSON: {event.data!r})", flush=True)
                        continue
                    printer.show(event.type, msg)
                    resumes = 0
                dropped = "the gateway closed the stream"
            except http.client.IncompleteRead:
                dropped = "the connection closed in the middle of the stream"
            except (OSError, http.client.HTTPException) as err:
                dropped = f"the stream broke: {err or type(err).__name__}"
            finally:
                conn.close()
            if printer.finished():
                return None
        if not request_id or resumes >= MAX_RESUMES:
            return f"{dropped} before the last message"
        # Resume after the last id seen: the gateway keeps every message.
        resumes += 1
        delay = sse.retry_ms / 1000 if sse.retry_ms is not None else min(2 ** (resumes - 1), 10)
        print(f"({dropped}; resuming after id {sse.last_id or 0} in {delay:g} s)", flush=True)
        time.sleep(delay)
        method, path, payload = "GET", f"/api/v1/orchestrations/{urllib.parse.quote(request_id, safe='')}/events", None


def main() -> int:
    parser = argparse.ArgumentParser(description="Orchestrate a request through the gateway over REST and SSE.")
    parser.add_argument("query", nargs="+", help="the request, in natural language")
    parser.add_argument(
        "--gateway",
        default=os.environ.get("AGENTMESH_GATEWAY_URL", "http://127.0.0.1:7404"),
        help="the gateway's address (default: $AGENTMESH_GATEWAY_URL or http://127.0.0.1:7404)",
    )
    parser.add_argument("--request-id", default="", help="request id to use (default: the gateway makes one)")
    parser.add_argument(
        "--timeout", type=float, default=300.0,
        help="seconds to wait for the next bytes of the stream (default 300; the gateway sends a comment every 15 s)",
    )
    args = parser.parse_args()
    query = " ".join(args.query)
    address = args.gateway if "://" in args.gateway else f"http://{args.gateway}"
    base = urllib.parse.urlsplit(address)
    if base.scheme not in ("http", "https") or not base.hostname:
        parser.error(f"--gateway {args.gateway!r} is not host:port or an http(s):// URL")

    body = {"query": query}
    if args.request_id:
        body["request_id"] = args.request_id
    printer = Printer()
    print(f"orchestrating over REST/SSE at {base.geturl()}: {query}", flush=True)
    try:
        stopped = follow(base, body, args.timeout, printer, SseParser())
    except GatewayError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # The gateway goes on for resume_grace_secs (30 s) in case we come back, then cancels.
        print("interrupted", file=sys.stderr)
        return 130

    problem = stopped or printer.failure()
    if problem:
        print(f"FAILED: {oneline(problem)}", flush=True)
        return 1
    print("completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
