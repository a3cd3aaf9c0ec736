#!/usr/bin/env python3
"""Orchestrate a request over gRPC and print every event as it arrives.

The stubs are generated at each start from the repository's proto/
directory (../../proto from this file, or --proto-dir) with grpcio-tools,
into a temporary directory, so they always match the protos. Then
GatewayService/Orchestrate is called with the query, and each
OrchestrateResponse is printed on one line as it arrives.

    pip install -r requirements.txt
    python3 client_grpc.py 'Count the words in "the quick brown fox jumps"'
    python3 client_grpc.py --gateway 127.0.0.1:7404 'What is the weather in Chicago?'

The gateway's address comes from --gateway, else AGENTMESH_GATEWAY_URL, else
127.0.0.1:7404 (`host:port`; an `http://` or `https://` prefix is accepted).

Exit status: 0 when the orchestration ends with a final answer that has
text, after a plan with steps whose execution completed; 1 when it ends
otherwise (an error message, a failed or cancelled execution, a plan with
no steps, an empty answer, or a stream that stops early) or the gRPC call
fails; 2 for bad arguments or stubs that cannot be generated; 130 after
Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

import grpc
from google.protobuf import json_format
from grpc_tools import protoc

DEFAULT_PROTO_DIR = Path(__file__).resolve().parent.parent.parent / "proto"


def generate_stubs(proto_dir: Path, out_dir: str) -> None:
    """Compiles every proto under proto_dir/agentmesh/v1 into out_dir, and
    puts out_dir on sys.path so that `agentmesh.v1.*_pb2` can be imported."""
    protos = sorted(str(p) for p in (proto_dir / "agentmesh" / "v1").glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files in {proto_dir / 'agentmesh' / 'v1'} (see --proto-dir)")
    # google/protobuf/*.proto (struct, timestamp) come with grpcio-tools.
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc could not compile the protos in {proto_dir}")
    sys.path.insert(0, out_dir)
    importlib.invalidate_caches()


def plain(value):
    """A protobuf Value or Struct as plain JSON data, whole numbers as ints
    (protobuf keeps every number as a double)."""
    def fix(v):
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
            return int(v)
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v

    return fix(json_format.MessageToDict(value))


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def oneline(text: str) -> str:
    """Text on one line: line breaks written as \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class Printer:
    """Prints OrchestrateResponse messages and tracks how the orchestration ends."""

    def __init__(self, executor_pb2, synthesis_pb2) -> None:
        self.kinds = executor_pb2.ExecutionEventKind
        self.action_kinds = synthesis_pb2.RecoveryActionKind
        self.steps = 0  # steps of the plan, extensions included
        self.execution_outcome = ""  # the last execution_completed/failed/cancelled
        self.execution_error = ""
        self.zero_step_reason = ""
        self.last = None  # the last message

    def kind_name(self, kind: int) -> str:
        return self.kinds.Name(kind).removeprefix("EXECUTION_EVENT_KIND_").lower()

    def show(self, msg) -> None:
        self.last = msg
        which = msg.WhichOneof("event")
        prefix = f"#{msg.sequence}" + (f" round {msg.round}" if msg.round else "")
        if which == "plan_created":
            text = self.plan_created(msg.plan_created)
        elif which == "execution_event":
            text = self.execution_event(msg.execution_event)
        elif which == "synthesis_chunk":
            text = f"answer chunk: {compact(msg.synthesis_chunk)}"
        elif which == "review":
            text = self.review(msg.review)
        elif which == "final_answer":
            answer = msg.final_answer
            achieved = "goal achieved" if answer.goal_achieved else "goal not achieved"
            execution = f", execution {answer.execution_id}" if answer.execution_id else ""
            text = f"final_answer ({achieved}{execution}): {answer.text}"
        elif which == "error":
            err = msg.error
            text = f"error from {err.service or '?'}: {err.code}: {err.message}"
        else:
            text = f"{which}: (a message this client does not know)"
        print(f"{prefix} {oneline(text)}", flush=True)

    def plan_created(self, created) -> str:
        plan, stats = created.plan, created.stats
        self.steps = len(plan.steps)
        if not plan.steps:
            self.zero_step_reason = created.zero_step_reason or "no reason given"
            return f"plan_created: no steps: {self.zero_step_reason}"
        steps = "; ".join(self.step(s) for s in plan.steps)
        calls = f"{stats.llm_calls} LLM call" + ("" if stats.llm_calls == 1 else "s")
        reasoning = f" | reasoning: {plan.reasoning}" if plan.reasoning else ""
        return (
            f"plan_created: {len(plan.steps)} step{'' if len(plan.steps) == 1 else 's'}: {steps}{reasoning}"
            f" | {calls}, model {stats.model or '?'} ({stats.provider or '?'})"
        )

    @staticmethod
    def step(s) -> str:
        after = f" after {', '.join(s.depends_on)}" if s.depends_on else ""
        return f"{s.step_id} {s.agent}/{s.capability} {compact(plain(s.parameters))}{after}"

    def execution_event(self, ev) -> str:
        kind = self.kind_name(ev.kind)
        if kind.startswith("step_"):
            details = [ev.agent_id] if ev.agent_id else []
            if ev.attempt:
                details.append(f"attempt {ev.attempt}")
            if ev.duration_ms:
                details.append(f"{ev.duration_ms} ms")
            text = f"{kind} {ev.step_id}" + (f" ({', '.join(details)})" if details else "")
            if ev.HasField("output"):
                text += f": {compact(plain(ev.output))}"
            if ev.error:
                text += f": {ev.error}"
            if ev.retry_delay_ms:
                text += f"; next attempt in {ev.retry_delay_ms} ms"
            return text
        if kind in ("execution_completed", "execution_failed", "execution_cancelled"):
            self.execution_outcome, self.execution_error = kind, ev.error
        text = f"{kind} {ev.execution_id}"
        if ev.step_id:
            text += f" (asked by {ev.step_id})"
        if ev.added_steps:
            self.steps += len(ev.added_steps)
            text += ": added " + "; ".join(self.step(s) for s in ev.added_steps)
        if ev.error:
            text += f": {ev.error}"
        return text

    def review(self, review) -> str:
        achieved = "goal achieved" if review.goal_achieved else "goal not achieved"
        text = f"review: {achieved}, confidence {review.confidence:.2f}: {review.summary}"
        if review.missing_data:
            text += f" | missing: {', '.join(review.missing_data)}"
        for action in review.recovery_actions:
            kind = self.action_kinds.Name(action.kind).removeprefix("RECOVERY_ACTION_KIND_").lower()
            target = action.collaboration
            where = f" {target.agent}/{target.capability}" if target.agent else ""
            text += f" | recovery {kind}{where}: {action.reason}"
        return text

    def failure(self) -> str | None:
        """Why the orchestration did not end as completed with an answer; None when it did."""
        which = self.last.WhichOneof("event") if self.last is not None else None
        if which == "error":
            return f"the orchestration failed in {self.last.error.service}: {self.last.error.code}"
        if which != "final_answer":
            return "the stream ended before the final answer"
        if self.zero_step_reason and not self.steps:
            return f"nothing was run (the plan has no steps): {self.zero_step_reason}"
        if self.execution_outcome != "execution_completed":
            outcome = self.execution_outcome or "no end of the execution was seen"
            return f"the execution did not complete: {outcome} {self.execution_error}".rstrip()
        if not self.last.final_answer.text.strip():
            return "the final answer is empty"
        return None


def grpc_target(address: str) -> tuple[str, bool]:
    """(host:port, use TLS) from `host:port` or an http(s):// URL."""
    if address.startswith("https://"):
        return address.removeprefix("https://").rstrip("/"), True
    return address.removeprefix("http://").rstrip("/"), False


def main() -> int:
    parser = argparse.ArgumentParser(description="Orchestrate a request through the gateway over gRPC.")
    parser.add_argument("query", nargs="+", help="the request, in natural language")
    parser.add_argument(
        "--gateway",
        default=os.environ.get("AGENTMESH_GATEWAY_URL", "http://127.0.0.1:7404"),
        help="the gateway's address (default: $AGENTMESH_GATEWAY_URL or http://127.0.0.1:7404)",
    )
    parser.add_argument("--request-id", default="", help="request id to use (default: the gateway makes one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the whole orchestration may take (default 300)")
    parser.add_argument("--proto-dir", type=Path, default=DEFAULT_PROTO_DIR, help=f"the proto root (default {DEFAULT_PROTO_DIR})")
    args = parser.parse_args()
    query = " ".join(args.query)

    with tempfile.TemporaryDirectory(prefix="agentmesh-stubs-") as out_dir:
        try:
            generate_stubs(args.proto_dir, out_dir)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        from agentmesh.v1 import executor_pb2, gateway_pb2, gateway_pb2_grpc, synthesis_pb2

    target, tls = grpc_target(args.gateway)
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials()) if tls else grpc.insecure_channel(target)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    request = gateway_pb2.OrchestrateRequest(query=query, request_id=args.request_id)
    printer = Printer(executor_pb2, synthesis_pb2)

    print(f"orchestrating over gRPC at {target}: {query}", flush=True)
    call = stub.Orchestrate(request, timeout=args.timeout)
    try:
        request_id = dict(call.initial_metadata() or ()).get("x-request-id")
        if request_id:
            print(f"request id {request_id}", flush=True)
        for msg in call:
            printer.show(msg)
    except grpc.RpcError as err:
        print(f"error: the gRPC call failed: {err.code().name}: {err.details()}", file=sys.stderr)
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            print(f"error: is the gateway running at {target}?", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        call.cancel()  # the gateway cancels the execution it started
        print("interrupted: the orchestration is cancelled", file=sys.stderr)
        return 130
    finally:
        channel.close()

    problem = printer.failure()
    if problem:
        print(f"FAILED: {oneline(problem)}", flush=True)
        return 1
    print("completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
