#!/usr/bin/env bash
# Runs the three Python examples against a running mesh and checks them:
#
#   agent.py        registers word-counter-py with discovery, serves the
#                   calls, and deregisters when stopped with SIGTERM;
#   client_grpc.py  orchestrates the request over gRPC;
#   client_rest.py  orchestrates it over REST with server-sent events.
#
# The mesh must be running, with an LLM that plans
# `Count the words in "the quick brown fox jumps"` as one call of
# word-counter-py's count_words: `agentmesh demo --serve` does. Addresses
# come from AGENTMESH_DISCOVERY_URL (default http://127.0.0.1:7400) and
# AGENTMESH_GATEWAY_URL (default http://127.0.0.1:7404); the interpreter from PYTHON
# (default python3), into which requirements.txt is installed with pip
# (unless AGENTMESH_SKIP_PIP=1 says it is installed already).
#
# Prints one PASS or FAIL line per example and exits 1 when any fails.
set -euo pipefail
cd "$(dirname "$0")"

DISCOVERY="${AGENTMESH_DISCOVERY_URL:-http://127.0.0.1:7400}"
[[ "$DISCOVERY" == *://* ]] || DISCOVERY="http://$DISCOVERY"
GATEWAY="${AGENTMESH_GATEWAY_URL:-http://127.0.0.1:7404}"
export AGENTMESH_DISCOVERY_URL="$DISCOVERY" AGENTMESH_GATEWAY_URL="$GATEWAY"
QUERY='Count the words in "the quick brown fox jumps"'
AGENT_ID=word-counter-py
CLIENT_TIMEOUT=120

# The interpreter itself rather than a wrapper (a pyenv shim, for one), so
# that the pid of the agent started below is the agent's.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')

work=$(mktemp -d)
agent_pid=""
cleanup() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -TERM "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

results=()
failed=0
pass() { results+=("PASS $1"); }
fail() { results+=("FAIL $1: $2"); failed=1; }
finish() {
  echo
  printf '%s\n' "${results[@]}"
  exit "$failed"
}
indent() { sed 's/^/    /' "$1"; }

# `STATUS BASE_URL` of a GET on discovery (STATUS 000: unreachable).
discovery_get() {
  "$PY" - "$DISCOVERY$1" <<'PY'
import json, sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as err:
    status, body = err.code, err.read()
except OSError:
    print("000 -")
    sys.exit()
try:
    base_url = json.loads(body).get("base_url") or "-"
except (ValueError, AttributeError):
    base_url = "-"
print(status, base_url)
PY
}

if [ "${AGENTMESH_SKIP_PIP:-}" = 1 ]; then
  echo "==> requirements.txt: taken as installed (AGENTMESH_SKIP_PIP=1)"
else
  echo "==> pip install -r requirements.txt ($PY)"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check -r requirements.txt
fi

echo "==> the mesh: discovery $DISCOVERY, gateway $GATEWAY"
read -r status _ < <(discovery_get /healthz) || true
if [ "$status" != 200 ]; then
  reason="discovery does not answer at $DISCOVERY (start the mesh: agentmesh demo --serve)"
  fail agent.py "$reason"; fail client_grpc.py "$reason"; fail client_rest.py "$reason"
  finish
fi

echo "==> agent.py"
"$PY" agent.py >"$work/agent.log" 2>&1 &
agent_pid=$!
base_url="" status="" registered=""
for _ in $(seq 1 300); do
  kill -0 "$agent_pid" 2>/dev/null || break
  line=$(grep -m1 "^$AGENT_ID serving " "$work/agent.log" || true)
  if [ -n "$line" ]; then
    base_url=$(sed -E 's|.* at (http://[^/]+)/.*|\1|' <<<"$line")
    read -r status registered < <(discovery_get "/api/v1/agents/$AGENT_ID") || true
    [ "$status" = 200 ] && [ "$registered" = "$base_url" ] && break
  fi
  sleep 0.1
done
if [ "${status:-}" != 200 ] || [ -z "$base_url" ] || [ "${registered:-}" != "$base_url" ]; then
  indent "$work/agent.log"
  reason="$AGENT_ID was not registered with discovery at its address"
  fail agent.py "$reason"; fail client_grpc.py "not run: $reason"; fail client_rest.py "not run: $reason"
  finish
fi
echo "    $AGENT_ID is registered at $base_url"

run_client() {
  local name=$1 out="$work/$1.out" rc=0
  echo "==> $name '$QUERY'"
  if command -v timeout >/dev/null; then
    timeout "$CLIENT_TIMEOUT" "$PY" "$name" --timeout "$CLIENT_TIMEOUT" "$QUERY" >"$out" 2>&1 || rc=$?
  else
    "$PY" "$name" --timeout "$CLIENT_TIMEOUT" "$QUERY" >"$out" 2>&1 || rc=$?
  fi
  indent "$out"
  # The text of the final answer, without the header (whose ids may hold digits).
  local answer
  answer=$(sed -nE 's/^#[0-9]+ (round [0-9]+ )?final_answer \([^)]*\): //p' "$out" | tail -n1)
  if [ "$rc" != 0 ]; then
    fail "$name" "exited with $rc"
  elif ! grep -Eq "^#[0-9]+ (round [0-9]+ )?step_succeeded s1 \($AGENT_ID, .*\): \{\"words\": 5\}$" "$out"; then
    fail "$name" "no step s1 of $AGENT_ID that answered {\"words\": 5}"
  elif ! grep -Eq '(^|[^0-9.])5\.?([^0-9]|$)' <<<"$answer"; then
    fail "$name" "the answer does not mention 5: $answer"
  else
    pass "$name"
  fi
}
run_client client_grpc.py
run_client client_rest.py

echo "==> stopping agent.py (SIGTERM)"
kill -TERM "$agent_pid"
for _ in $(seq 1 150); do
  kill -0 "$agent_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$agent_pid" 2>/dev/null; then
  kill -KILL "$agent_pid" 2>/dev/null || true
  wait "$agent_pid" 2>/dev/null || true
  agent_rc=timeout
else
  agent_rc=0
  wait "$agent_pid" || agent_rc=$?
fi
agent_pid=""
indent "$work/agent.log"
read -r status _ < <(discovery_get "/api/v1/agents/$AGENT_ID") || true
calls=$(grep -c "count_words exe_" "$work/agent.log" || true)
if [ "$agent_rc" = timeout ]; then
  fail agent.py "did not stop within 15 s of SIGTERM"
elif [ "$agent_rc" != 0 ]; then
  fail agent.py "exited with $agent_rc after SIGTERM"
elif [ "$status" != 404 ]; then
  fail agent.py "still registered after it stopped (GET answered $status)"
elif [ "$calls" -lt 2 ]; then
  fail agent.py "served $calls calls from the executor, expected 2"
else
  pass agent.py
fi

finish
