// client.mjs drives the real graphql-ws client (npm graphql-ws, over the npm
// ws WebSocket) against a fanwire gateway for gateway/graphql_node_test.go.
//
//	node client.mjs ws://127.0.0.1:PORT/graphql
//
// It connects at once (lazy: false, no retries) and then reads commands from
// stdin, one JSON object a line:
//
//	{"cmd":"subscribe","key":"a","query":"...","variables":{...}}  an operation (a query or a subscription)
//	{"cmd":"unsubscribe","key":"a"}  the unsubscribe function subscribe returned (sends complete)
//	{"cmd":"exit"}                   dispose the client and exit 0
//
// and prints what happens on stdout, one JSON object a line, in order:
//
//	{"connected":true}
//	{"key":"a","next":<the next message's payload, as received>}
//	{"key":"a","error":{"errors":[...]}}          an error message's GraphQL errors
//	{"key":"a","error":{"close":{"code":4400,"reason":"..."}}}  the socket closed under it
//	{"key":"a","error":{"message":"..."}}         anything else thrown
//	{"key":"a","complete":true}
//	{"unsubscribed":"a"}                          after the unsubscribe call returned
//	{"closed":{"code":1000,"reason":"..."}}       the socket closed
//
// With FANWIRE_TOKENS set to a JSON array of tokens, each connection
// attempt sends the next token in its connection_init payload ({"token"};
// the last one is used again), and a closed connection is retried at once,
// up to 5 times, with graphql-ws re-subscribing what is active: how an
// application renews an expiring token (close 4001).
//
// Payloads are printed with JSON.stringify, which keeps the server's key
// order, so the test can compare lines byte for byte. The process exits 2
// (after printing {"fatal":"..."}) if it is still running after 10 s.
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { createInterface } from 'node:readline';

const out = (v) => process.stdout.write(JSON.stringify(v) + '\n');

const url = process.argv[2];
if (!url) {
  out({ fatal: 'usage: node client.mjs ws://host:port/graphql' });
  process.exit(2);
}

const watchdog = setTimeout(() => {
  out({ fatal: 'still running after 10 s' });
  process.exit(2);
}, 10_000);
watchdog.unref();

const describe = (e) => {
  if (Array.isArray(e)) return { errors: e };
  if (e && typeof e === 'object' && 'code' in e && 'reason' in e) return { close: { code: e.code, reason: e.reason } };
  return { message: String(e?.message ?? e) };
};

const tokens = process.env.FANWIRE_TOKENS ? JSON.parse(process.env.FANWIRE_TOKENS) : null;
let attempt = 0;

const client = createClient({
  url,
  webSocketImpl: WebSocket,
  lazy: false,
  retryAttempts: tokens ? 5 : 0,
  retryWait: async () => {},
  connectionParams: tokens ? () => ({ token: tokens[Math.min(attempt++, tokens.length - 1)] }) : undefined,
  onNonLazyError: (e) => out({ error: describe(e) }),
  on: {
    connected: () => out({ connected: true }),
    closed: (e) => out({ closed: { code: e?.code, reason: e?.reason } }),
  },
});

const unsubscribers = new Map();

const commands = createInterface({ input: process.stdin });
for await (const line of commands) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  switch (c.cmd) {
    case 'subscribe': {
      const { key } = c;
      const unsubscribe = client.subscribe(
        { query: c.query, variables: c.variables ?? undefined },
        {
          next: (payload) => out({ key, next: payload }),
          error: (e) => out({ key, error: describe(e) }),
          complete: () => out({ key, complete: true }),
        },
      );
      unsubscribers.set(key, unsubscribe);
      break;
    }
    case 'unsubscribe':
      unsubscribers.get(c.key)();
      out({ unsubscribed: c.key });
      break;
    case 'exit':
      await client.dispose();
      process.exit(0);
    default:
      out({ fatal: `unknown command ${JSON.stringify(c.cmd)}` });
      process.exit(2);
  }
}
// stdin closed: the test is gone.
await client.dispose();
process.exit(0);
