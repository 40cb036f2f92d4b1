// Follows one halfpi conversation with the Durable Streams ecosystem's own
// client (@durable-streams/client), as any front end would: from offset -1,
// live (long-poll or sse), a bearer token in the headers. Prints one JSON
// line per batch the client delivers ({items, offset, upToDate}); when the
// client's stream fails (the connection cut under it), it says so
// ({error, resume}) and follows on from the last offset it was given —
// the protocol's way to resume (PROTOCOL.md §8: clients keep their offset).
// Ends when its stdin closes.
//
//   node driver.mjs <base url> <conversation id> <token> <long-poll|sse>
import { stream } from "@durable-streams/client"

const [base, conversation, token, live] = process.argv.slice(2)
const url = `${base}/v1/conversations/${encodeURIComponent(conversation)}/stream`
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n")
process.stdin.on("end", () => process.exit(0))
process.stdin.resume()

let offset = "-1"
for (;;) {
  try {
    const res = await stream({
      url,
      offset,
      live,
      json: true,
      headers: { Authorization: `Bearer ${token}` },
      backoffOptions: { initialDelay: 50, maxDelay: 500, multiplier: 1.5, maxRetries: 200 },
    })
    res.subscribeJson((batch) => {
      offset = batch.offset
      say({ items: batch.items, offset: batch.offset, upToDate: batch.upToDate })
    })
    await res.closed
    say({ closed: true, resume: offset })
  } catch (err) {
    say({ error: String(err && err.message ? err.message : err), resume: offset })
  }
  await new Promise((resolve) => setTimeout(resolve, 50))
}
