// A Discord-PXE bot worker in JavaScript, with only the public NATS
// client (the npm package "nats"): it reads MESSAGE_CREATE events from
// the fleet's stream through a durable consumer, acknowledges each after
// handling it, then sends Gateway commands to shard 0.
//
//   NATS_URL=nats://127.0.0.1:4222 node worker.mjs
//
// Environment: NATS_URL, NATS_USER and NATS_PASS (dpxe workers add),
// DPXE_APP (default bot), COUNT (stop after that many events; default:
// run on).
import { connect, AckPolicy, DeliverPolicy, StringCodec } from "nats";

const app = process.env.DPXE_APP ?? "bot";
const nc = await connect({
  servers: (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(","),
  user: process.env.NATS_USER,
  pass: process.env.NATS_PASS,
});

// A durable consumer per bot service, filtered by event name; every
// process of the service shares it.
const stream = `DPXE_EVENTS_${app}`;
const jsm = await nc.jetstreamManager();
await jsm.consumers.add(stream, {
  durable_name: "jsworker",
  filter_subject: `dpxe.${app}.events.*.MESSAGE_CREATE`,
  ack_policy: AckPolicy.Explicit,
  deliver_policy: DeliverPolicy.All,
});
const consumer = await nc.jetstream().consumers.get(stream, "jsworker");

let left = Number(process.env.COUNT ?? Infinity);
const messages = await consumer.consume();
for await (const m of messages) {
  const frame = m.json(); // the Discord Gateway frame, unchanged
  const shard = m.headers.get("Dpxe-Shard");
  const seq = m.headers.get("Dpxe-Seq");
  console.log(`event shard=${shard} seq=${seq} t=${frame.t} content=${JSON.stringify(frame.d.content)}`);
  m.ack(); // after handling: an event left unacknowledged is delivered again
  if (--left <= 0) break;
}

// A command is a request to dpxe.<app>.commands.<shard>; the node running
// the shard answers {"status":"ok"} or an error code with a reason.
const sc = StringCodec();
for (const cmd of [
  { op: 3, d: { since: null, activities: [], status: "online", afk: false } },
  { op: 2, d: { token: "never-sent" } },
]) {
  const reply = await nc.request(`dpxe.${app}.commands.0`, sc.encode(JSON.stringify(cmd)), { timeout: 5000 });
  const r = reply.json();
  console.log(`command op=${cmd.op} status=${r.status}${r.reason ? ` reason=${JSON.stringify(r.reason)}` : ""}`);
}
await nc.drain();
