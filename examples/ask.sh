#!/usr/bin/env bash
# Ask the Mind one question in a new conversation; print the final answer.
#
#   examples/ask.sh "what is the plan?" [--url ws://…/v1/face] [--token …]
#
# The headless face reconnects and resumes by itself. If the Mind restarts in
# the middle of the reply, the chat ends `interrupted`; --retry-interrupted
# is this script's explicit decision to ask again (nothing re-runs on its own).
# Set HALFPI_ASK_LOG=FILE to keep the whole JSONL exchange.
set -euo pipefail
question=$1
shift
python3 -c 'import json, sys; print(json.dumps({"type": "face.chat", "payload": {"content": sys.argv[1]}}))' "$question" \
  | halfpi face --mode headless --new-conversation ask --retry-interrupted 3 "$@" \
  | tee "${HALFPI_ASK_LOG:-/dev/null}" \
  | python3 -c '
import json, sys
answer = None
for line in sys.stdin:
    message = json.loads(line)
    payload = message["payload"]
    if message["type"] == "face.result" and payload.get("status") == "succeeded" and "content" in payload:
        answer = payload["content"]
if answer is None:
    sys.exit(1)
print(answer)
'
