// Drives a real halfpi mind with AG-UI's own client (@ag-ui/client HttpAgent,
// its event verifier on) and prints what the client assembled, as JSON.
//
//   node driver.mjs URL TOKEN THREAD MODE TEXT
//   MODE run:   one runAgent; if the stream is cut, rejoin with connectAgent
//               (GET /v1/agui with Last-Event-ID) until the run ends
//   MODE tool:  runAgent ends on an interrupt; answer it (allow_once) with a
//               second runAgent carrying `resume`
import { HttpAgent, runHttpRequest, transformHttpEventStream } from "@ag-ui/client";

// A cut connection also rejects the client's own reader.cancel() on teardown
// (it re-throws what is not an AbortError): that one is the cut, seen twice.
process.on("unhandledRejection", (error) => {
  if (String(error).includes("terminated")) return;
  throw error;
});

const [url, token, threadId, mode, text] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${token}` };
let lastId = null; // the id: of the last whole event read
let cuts = 0;

// Reads the raw SSE bytes beside the client to keep the last event's id
// (the client's own parser reads only `data:`).
function trackingFetch(input, init) {
  return fetch(input, init).then((response) => {
    if (!response.body) return response;
    const [mine, theirs] = response.body.tee();
    (async () => {
      const reader = mine.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          const blocks = buffer.split("\n\n");
          buffer = blocks.pop();
          for (const block of blocks) {
            for (const line of block.split("\n")) {
              if (line.startsWith("id: ")) lastId = line.slice(4);
            }
          }
        }
      } catch {
        /* the cut: the client's side sees it too */
      }
    })();
    return new Response(theirs, { status: response.status, headers: response.headers });
  });
}

class HalfpiAgent extends HttpAgent {
  // AG-UI's hook for rejoining a run: GET the thread's active run from lastId.
  connect(input) {
    const target = `${this.url}?threadId=${encodeURIComponent(input.threadId)}` +
      `&runId=${encodeURIComponent(input.runId)}`;
    const headers = { ...this.headers, Accept: "text/event-stream" };
    if (lastId) headers["Last-Event-ID"] = lastId;
    return transformHttpEventStream(runHttpRequest(() => this.fetch(target, { headers })));
  }
}

const agent = new HalfpiAgent({ url: `${url}/v1/agui`, headers: auth, threadId,
                                fetch: trackingFetch, debug: false });
const log = [];
const subscriber = {
  onEvent: ({ event }) => { log.push(event.type); },
  onTextMessageContentEvent: () => { process.stdout.write("CONTENT\n"); },
};

async function runOnce(params) {
  let finished = false;
  const watch = { onRunFinishedEvent: () => { finished = true; },
                  onRunErrorEvent: () => { finished = true; } };
  try {
    await agent.runAgent(params, { ...subscriber, ...watch });
  } catch (error) {
    if (finished) throw error;
    cuts += 1;
  }
  while (!finished) {
    try {
      await agent.connectAgent({ runId: params.runId }, { ...subscriber, ...watch });
    } catch (error) {
      if (finished) throw error;
      cuts += 1;
      if (cuts > 5) throw error;
    }
  }
}

agent.messages = [{ id: "local-1", role: "user", content: text }];
await runOnce({ runId: `${threadId}-run-1` });
if (mode === "tool") {
  const interrupts = agent.pendingInterrupts;
  if (!interrupts.length) throw new Error("expected an interrupt");
  await runOnce({
    runId: `${threadId}-run-2`,
    resume: interrupts.map((i) => ({ interruptId: i.id, status: "resolved",
                                     payload: { decision: "allow_once" } })),
  });
}
process.stdout.write(`RESULT ${JSON.stringify({ messages: agent.messages, cuts, log })}\n`);
