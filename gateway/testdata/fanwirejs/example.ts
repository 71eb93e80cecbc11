// example.ts: type-checked with tsc --noEmit against fanwire.d.ts by
// fanwire's Go tests (gateway/clientjs_test.go); it is never run.
import {Client, connect, DEFAULT_BACKOFF, FanwireError, PresenceRoom, Subscription, View, type FanwireErrorCode, type Member, type MembersPage, type PresenceChange, type PresenceMessage, type FanwireEvent, type Gap, type GapReason, type State, type ViewChange} from "../../client/fanwire.js";
import {WebSocket} from "ws";

interface Order {
  id: number;
  status: string;
  total?: number;
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

// The API of issue 24: classes, ready promises, per-subscription listeners,
// async iteration, AbortSignal, timeouts.
async function newAPI(): Promise<void> {
  const anonymous = new Client("ws://node-a:8080/ws", {
    WebSocket,
    getToken: () => (Math.random() < 0.5 ? null : undefined),
    tokenTimeout: 5_000,
    publishTimeout: 2_000,
  });
  const c = connect("ws://node-a:8080/ws", {WebSocket, getToken: async () => (Math.random() < 0.5 ? "a JWT" : undefined)});
  if (c instanceof Client) await c.ready(10_000);
  await anonymous.ready();
  anonymous.on("state", (state, detail) => {
    if (state === "disconnected" && detail.code === 4000) console.warn("the client dropped a silent connection");
  });

  const abort = new AbortController();
  const orders = c.subscribe<Order>("orders.*", {from: null, durable: null, signal: abort.signal, buffer: 50});
  if (orders instanceof Subscription) console.log(orders.id, orders.durable);
  const same: Subscription<Order> = await orders.ready(5_000);
  const removers: Array<() => void> = [
    same.on("event", (ev) => console.log(ev.data.id, ev.cursor)),
    same.on("event", async (ev: FanwireEvent<Order>) => {
      await Promise.resolve(ev.data.status);
    }),
    same.on("subscribed", (s) => console.log(s.cursor)),
    same.on("gap", (gap) => {
      const reason: GapReason = gap.reason;
      if (reason === "overflow") console.warn(gap.subscription.pattern, gap.cursor);
    }),
    same.on("error", (err) => {
      if (err.code === "durable_in_use" && err.retrying) console.warn("retrying", err.subscription?.id);
    }),
  ];
  for await (const ev of orders) {
    const order: Order = ev.data;
    if (order.status === "done") break;
  }
  const it: AsyncIterableIterator<FanwireEvent<Order>> = orders[Symbol.asyncIterator]();
  const first = await it.next();
  if (!first.done) console.log(first.value.subject);
  removers.forEach((remove) => remove());
  abort.abort();

  // subscribe without onEvent, with options only, and the old forms.
  const bare = c.subscribe("public.>");
  bare.unsubscribe();
  c.subscribe("public.>", {resync: "live"}).unsubscribe();
  c.subscribe("public.>", {}, async (ev) => {
    await Promise.resolve(ev.subject);
  });

  const publishAbort = new AbortController();
  try {
    const cursor: string | undefined = await c.publish("chat.acme.7", {text: "hi"}, {signal: publishAbort.signal, timeout: 1_000});
    console.log(cursor);
    await c.publish("chat.acme.7", "no options");
    await c.publish("chat.acme.7", 7, {});
  } catch (e) {
    if (e instanceof FanwireError) {
      const code: FanwireErrorCode | (string & {}) = e.code;
      switch (code) {
        case "aborted":
        case "timeout":
        case "too_large":
        case "handler":
          console.error(code, e.cause, e.closeCode);
      }
    }
  }
  const own = new FanwireError("x", "y");
  const withExtra = new FanwireError("handler", "onEvent threw", {cause: new Error("boom"), subscription: orders});
  const asError: Error = own;
  console.log(asError.message, withExtra.subscription?.pattern, withExtra.cause);
  await Promise.all([c.close(), anonymous.close()]);
}
void newAPI();

// The API of issue 25: where, from "latest", leave and synced, live views.
async function views(): Promise<void> {
  const c = connect("ws://node-a:8080/ws", {WebSocket});
  const raw = c.subscribe<Order>("db.orders.*", {where: "doc.status == 'open'", from: "latest", resync: "latest"});
  const where: string | undefined = raw.where;
  raw.on("leave", (subject: string, cursor: string | undefined) => console.log("left", subject, cursor, where));
  raw.on("synced", (cursor, keys) => console.log("synced at", cursor, keys?.length ?? "no keys"));
  c.subscribe("db.orders.*", {where: null, from: "js:120"}).unsubscribe();

  const abort = new AbortController();
  const open = c.view<Order>("db.orders.*", {where: "doc.status == 'open' && doc.total > 100", signal: abort.signal});
  if (open instanceof View) console.log(open.pattern, open.where, open.cursor, open.closed, open.subscription.id);
  const removers: Array<() => void> = [
    open.on("change", (change: ViewChange<Order>) => {
      if (change.type === "remove") console.log("gone", change.key, change.doc.id);
      else console.log("now", change.key, change.doc.status);
    }),
    open.on("synced", (v) => console.log(v.docs.size, "open orders at", v.cursor)),
    open.on("error", (err) => {
      if (err.code === "bad_filter" || err.code === "view_too_large") console.error(err.message);
    }),
  ];
  const same: View<Order> = await open.ready(10_000);
  for (const [key, order] of same.docs) console.log(key, order.id, order.status);
  const one: Order | undefined = open.docs.get("db.orders.42");
  console.log(one?.total);
  removers.forEach((remove) => remove());
  open.close();
  c.view("db.items.*").close();
  await c.close();
}
void views();

// Presence: a member with a state, its room, and the raw messages.
interface Who {
  name: string;
  typing?: boolean;
}

async function presence(): Promise<void> {
  const c = connect("ws://node-a:8080/ws", {WebSocket});
  const me: string = await c.track("room.1", {name: "ann"} satisfies Who);
  console.log("my key", me);
  await c.track("room.2");
  try {
    await c.track("room.1", {name: "ann", typing: true});
  } catch (e) {
    if (e instanceof FanwireError && (e.code === "too_large" || e.code === "too_many_tracks" || e.code === "rate_limited")) console.error(e.subject, e.message);
  }
  const page: MembersPage<Who> = await c.members<Who>("room.1", {limit: 50});
  const next: string | undefined = page.next;
  if (next !== undefined) await c.members("room.1", {after: next, limit: 50});
  for (const m of page.members) console.log(m.conn, m.sub ?? "anonymous", m.state.name, page.count);

  const abort = new AbortController();
  const room = c.presence<Who>("room.1", {
    onChange: (change: PresenceChange<Who>) => {
      for (const m of change.joins) console.log("joined", m.conn, m.state.name);
      for (const m of change.leaves) console.log("left", m.conn);
      for (const m of change.updates) console.log("typing", m.state.typing === true);
      console.log(change.count, "here");
    },
    pageSize: 200,
    signal: abort.signal,
  });
  if (room instanceof PresenceRoom) console.log(room.subject, room.count, room.closed, room.subscription.presence);
  const same: PresenceRoom<Who> = await room.ready(5000);
  const ann: Member<Who> | undefined = same.members.get("conn-id");
  console.log(ann?.state.name);
  room.on("synced", (r) => console.log(r.members.size));
  room.on("error", (err) => console.error(err.code));
  room.subscription.on("event", (ev) => console.log(ev.data));
  room.close();

  const watch = c.subscribe("room.*", {presence: true}, () => {});
  watch.on("presence", (m: PresenceMessage) => console.log(m.subject, m.count, m.joins.length, m.leaves.map((l) => l.conn), m.updates.length));
  await c.untrack("room.1");
  await c.close();
}
void presence();
