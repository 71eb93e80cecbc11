// example.ts: type-checked with tsc --noEmit against fanwire.d.ts by
// fanwire's Go tests (gateway/client_test.go); it is never run.
import {connect, DEFAULT_BACKOFF, FanwireError, type FanwireEvent, type Gap, type State} from "../../client/fanwire.js";
import {WebSocket} from "ws";

interface Order {
  id: number;
  status: string;
}

const client = connect(["ws://node-a:8080/ws", "ws://node-b:8080/ws"], {
  WebSocket,
  getToken: async () => "a JWT",
  backoff: {initial: DEFAULT_BACKOFF.initial, max: 10_000},
});
client.on("state", (state: State, detail) => console.log(state, detail.code, detail.connectionId));
client.on("gap", (gap: Gap) => console.warn(gap.subscription.pattern, gap.reason, gap.cursor));
client.on("error", (err: FanwireError) => console.error(err.code, err.id, err.subscription?.pattern, err.message));

const sub = client.subscribe<Order>("orders.*", {from: "first", resync: "first"}, (event: FanwireEvent<Order>) => {
  const status: string = event.data.status;
  const cursor: string | undefined = event.cursor;
  console.log(event.subject, status, cursor);
});
const live = client.subscribe("public.>", (event) => console.log(event.data));
live.unsubscribe();
console.log(sub.id, sub.pattern, sub.cursor, sub.closed, client.state, client.url);

async function main(): Promise<void> {
  try {
    const cursor: string | undefined = await client.publish("chat.acme.7", {text: "hi"});
    console.log(cursor);
  } catch (e) {
    if (e instanceof FanwireError && e.code === "forbidden") console.error("no publish grant");
  }
  await client.close();
}
void main();
