#!/usr/bin/env bash
# Ask the Mind one question in a new conversation; print the final answer.
#
#   examples/ask.sh "what is the plan?" [halfpi face options: --url ws://…/v1/face --token …]
#
# Without --url it asks the Mind of $HALFPI_HOME (or ~/.halfpi), wherever it
# listens. The answer goes to stdout; why a question did not get a plain
# answer goes to stderr, and the exit status is the headless face's
# (docs/faces.md): 0 answered, 1 failed, 2 token refused, 3 cancelled,
# 4 a tool was denied, 5 a tool's approval expired, 6 interrupted,
# 64 usage, 69 no Mind reachable within 30 s (--connect-timeout S changes it).
#
# The headless face reconnects and resumes by itself. If the Mind restarts in
# the middle of the reply, the chat ends `interrupted`; --retry-interrupted
# is this script's explicit decision to ask again (nothing re-runs on its own).
# Set HALFPI_ASK_LOG=FILE to keep the whole JSONL exchange.
set -uo pipefail
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: $0 QUESTION [halfpi face options…]" >&2
  exit 64
fi
question=$1
shift
python3 -c 'import json, sys; print(json.dumps({"type": "face.chat", "payload": {"content": sys.argv[1]}}))' "$question" \
  | halfpi face --mode headless --new-conversation ask --retry-interrupted 3 --connect-timeout 30 "$@" \
  | tee "${HALFPI_ASK_LOG:-/dev/null}" \
  | python3 -c '
import json, sys
answer = None
for line in sys.stdin:
    message = json.loads(line)
    payload = message["payload"]
    if message["type"] == "face.result" and "content" in payload:
        answer = payload["content"]  # the last chat result: the one that stands
if answer:
    print(answer)
'
status=("${PIPESTATUS[@]}")
# The face's status says what happened; a broken step of the pipe otherwise.
if [ "${status[1]}" -ne 0 ]; then exit "${status[1]}"; fi
for code in "${status[@]}"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
exit 0
