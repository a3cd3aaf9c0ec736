"""An A2A agent written with the official SDK (a2a-sdk), for tests/a2a.rs.

    python a2a_agent.py PORT VERSION STREAMING

serves, on 127.0.0.1:PORT, a card declaring protocol VERSION (1.0 or 0.3)
with streaming on or off, and one skill, `convert_currency`: "100 USD in
EUR" completes with the amount at fixed rates (text and data parts). A
message naming no known currency asks which one (input-required); one
naming XXX fails; one saying "slowly" works for 30 seconds first. Every
message received is printed as a JSON line on stdout, metadata included,
and so is each call's method and A2A-Version header.
"""

import asyncio
import json
import re
import sys

import uvicorn
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.types.a2a_pb2 import Part, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware

RATES = {"USD": 1.0, "EUR": 0.92, "JPY": 151.0, "GBP": 0.79}


class Converter(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        print(json.dumps({"received": MessageToDict(message)}), flush=True)
        task = context.current_task or new_task_from_user_message(message)
        if not context.current_task:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue=event_queue, task_id=task.id, context_id=task.context_id)
        await updater.update_status(state=TaskState.TASK_STATE_WORKING, message=new_text_message("reading the amount"))
        text = get_message_text(message)
        if "slowly" in text:
            await asyncio.sleep(30)
        if "XXX" in text:
            await updater.update_status(
                state=TaskState.TASK_STATE_FAILED, message=new_text_message("XXX is not a currency I can price")
            )
            return
        amount = re.search(r"(\d+(?:\.\d+)?)", text)
        codes = [c for c in re.findall(r"\b[A-Z]{3}\b", text) if c in RATES]
        if not amount or len(codes) < 2:
            await updater.update_status(
                state=TaskState.TASK_STATE_INPUT_REQUIRED,
                message=new_text_message("Which currencies? Say e.g. '100 USD in EUR'."),
            )
            return
        value, source, target = float(amount.group(1)), codes[0], codes[1]
        result = round(value / RATES[source] * RATES[target], 2)
        await updater.update_status(state=TaskState.TASK_STATE_WORKING, message=new_text_message("converting"))
        data = Value()
        data.struct_value.update({"amount": value, "from": source, "to": target, "result": result})
        await updater.add_artifact(
            parts=[Part(text=f"{value:g} {source} = {result:.2f} {target}"), Part(data=data)], name="conversion"
        )
        await updater.update_status(state=TaskState.TASK_STATE_COMPLETED, message=new_text_message("done"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("cancel is not supported")


def main() -> None:
    port, version, streaming = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "true"
    card = AgentCard(
        name="Currency Agent",
        description="Converts amounts between currencies at fixed rates",
        version="1.2.0",
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        capabilities=AgentCapabilities(streaming=streaming),
        supported_interfaces=[
            AgentInterface(protocol_binding="JSONRPC", url=f"http://127.0.0.1:{port}/", protocol_version=version)
        ],
        skills=[
            AgentSkill(
                id="convert_currency",
                name="Convert currency",
                description="Converts an amount of money from one currency to another (USD, EUR, JPY, GBP)",
                tags=["money", "currency"],
                examples=["100 USD in EUR", "How many yen is 20 GBP?"],
            )
        ],
    )
    handler = DefaultRequestHandler(agent_executor=Converter(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True)
    app = Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=show_calls)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


async def show_calls(request, call_next):
    """Prints which method, in which protocol version, each call came in."""
    if request.method == "POST":
        body = json.loads(await request.body() or b"{}")
        version = request.headers.get("a2a-version", "")
        print(json.dumps({"call": body.get("method"), "version": version}), flush=True)
    return await call_next(request)


if __name__ == "__main__":
    main()
