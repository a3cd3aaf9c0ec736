"""LangGraph on the executor benchmark's workload, for comparison.

The same no-op HTTP agent (`executor-bench agent`), one HTTP call per node:
a fan-out of N nodes started together (the Send API) and a chain of N nodes,
in memory and with LangGraph's PostgreSQL checkpointer (durability "sync").

    pip install "langgraph==1.2.22" langgraph-checkpoint-postgres "psycopg[binary]" httpx
    python crates/bench/peers/langgraph_bench.py --agent http://127.0.0.1:PORT \
        --postgres postgresql://postgres@127.0.0.1:5432/postgres
"""

import argparse
import asyncio
import operator
import statistics
import time
import uuid
from typing import Annotated, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send


class State(TypedDict):
    calls: Annotated[int, operator.add]


def fanout_graph(client, url, n, concurrency):
    # At most `concurrency` calls at once, as the executor's fan-out runs
    # (and as many as the HTTP client keeps connections for).
    slots = asyncio.Semaphore(concurrency)

    async def call(_arg):
        async with slots:
            response = await client.post(url, json={})
        response.raise_for_status()
        return {"calls": 1}

    def fan(_state):
        return [Send("call", {"i": i}) for i in range(n)]

    graph = StateGraph(State)
    graph.add_node("call", call)
    graph.add_conditional_edges(START, fan, ["call"])
    graph.add_edge("call", END)
    return graph


def chain_graph(client, url, n, _concurrency):
    graph = StateGraph(State)
    previous = START
    for i in range(n):
        async def node(_state):
            response = await client.post(url, json={})
            response.raise_for_status()
            return {"calls": 1}

        graph.add_node(f"n{i}", node)
        graph.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    graph.add_edge(previous, END)
    return graph


async def measure(compiled, n, runs, durability):
    walls = []
    for run in range(runs + 1):
        config = {"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": n + 10}
        started = time.perf_counter()
        result = await compiled.ainvoke({"calls": 0}, config, durability=durability)
        wall = time.perf_counter() - started
        assert result["calls"] == n, result
        if run > 0:
            walls.append(wall)
    return statistics.median(walls), walls


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", required=True)
    parser.add_argument("--postgres")
    parser.add_argument("--fanout", type=int, default=1000)
    parser.add_argument("--fanout-concurrency", type=int, default=256)
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    url = f"{args.agent}/skills/noop"
    limits = httpx.Limits(max_connections=args.fanout_concurrency, max_keepalive_connections=args.fanout_concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30, pool=None)) as client:
        stores = [("memory", None)]
        if args.postgres:
            stores.append(("PostgreSQL, durability sync", args.postgres))
        rows = []
        for name, dsn in stores:
            saver_context = None
            saver = None
            if dsn:
                from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

                saver_context = AsyncPostgresSaver.from_conn_string(dsn)
                saver = await saver_context.__aenter__()
                await saver.setup()
            for scenario, build, n in [("fan-out", fanout_graph, args.fanout), ("chain", chain_graph, args.chain)]:
                compiled = build(client, url, n, args.fanout_concurrency).compile(checkpointer=saver)
                median, walls = await measure(compiled, n, args.runs, "sync" if dsn else None)
                rows.append((name, f"{scenario}, {n} steps", median, n / median, median * 1e6 / n, walls))
            if saver_context:
                await saver_context.__aexit__(None, None, None)
    print("| LangGraph state | scenario | wall ms (median) | steps/s | µs per step | each run, ms |")
    print("|---|---|---|---|---|---|")
    for name, scenario, median, rate, per_step, walls in rows:
        each = " / ".join(f"{w * 1000:.0f}" for w in walls)
        print(f"| {name} | {scenario} | {median * 1000:.1f} | {rate:.0f} | {per_step:.0f} | {each} |")


if __name__ == "__main__":
    asyncio.run(main())
