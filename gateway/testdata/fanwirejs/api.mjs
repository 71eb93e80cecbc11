// api.mjs: the commands of run.mjs that drive fanwire.js's promise and
// iterator API (ready, per-subscription listeners, async iteration,
// AbortSignal, timeouts), for fanwire's Go tests (gateway/clientjs_api_test.go).
// Each subscription and AbortController has a name the test gives; the lines
// printed carry it as "sub". Commands (JSON, one per line on stdin):
//   {"cmd":"ready","timeout"?}            -> client_ready | client_ready_error {code, data.n: ms}
//   {"cmd":"subscribe","name","pattern","options"?,  subscribe(pattern, options) with, as asked:
//    "onEvent"?: true,                      -> event (onEvent)
//    "listen"?: true,                       -> sub_event, sub_subscribed, sub_gap {reason, cursor}, sub_error {code}
//    "ready"?: true, "timeout"?,            -> sub_ready | sub_ready_error {code, data.n: ms}
//    "abort"?: true, "preAborted"?: true,   options.signal: a controller of that name, or an aborted signal
//    "iterate"?: true, "pauseAfter"?: n, "breakAfter"?: n}
//                                           -> iter per event, paused {data.n} once n were read (until
//                                              resume), iter_end {code, state: "closed"|"open"} at the end
//   {"cmd":"abort","name"}                 -> aborted {state: the subscription's "closed"|"open", if any}
//   {"cmd":"resume","name"}
//   {"cmd":"publish","subject","data","name"?,"timeout"?,"abort"?,"preAborted"?}: publish(subject, data, options)
//                                           -> published {sub, cursor, data.n: ms} | publish_error {sub, code, data.n: ms}
//   {"cmd":"heap"}                          -> heap {data.n: bytes in use after a full GC}
//   {"cmd":"reconnect"}
// A command that throws prints cmd_error {message}.
import v8 from "node:v8";
import vm from "node:vm";

const subs = new Map(); // name -> Subscription
const aborts = new Map(); // name -> AbortController
const pauses = new Map(); // name -> resolve of a paused iterator

const ms = (start) => ({n: Math.round(performance.now() - start)});
const state = (sub) => (sub ? (sub.closed ? "closed" : "open") : undefined);

function signalFor(c) {
  if (c.preAborted) return AbortSignal.abort();
  if (!c.abort) return undefined;
  const ac = new AbortController();
  aborts.set(c.name, ac);
  return ac.signal;
}

// handle runs one command c on client, printing with out. It returns false
// for a command it does not know.
export async function handle(client, c, out) {
  const name = c.name;
  switch (c.cmd) {
    case "ready": {
      const start = performance.now();
      try {
        await client.ready(c.timeout);
        out({k: "client_ready", data: ms(start)});
      } catch (e) {
        out({k: "client_ready_error", code: e.code, message: e.message, data: ms(start)});
      }
      return true;
    }
    case "subscribe": {
      const options = {...(c.options || {})};
      const signal = signalFor(c);
      if (signal) options.signal = signal;
      const sub = c.onEvent
        ? client.subscribe(c.pattern, options, (ev) => out({k: "event", sub: name, subject: ev.subject, data: {n: ev.data.n}, cursor: ev.cursor}))
        : client.subscribe(c.pattern, options);
      subs.set(name, sub);
      if (c.listen) {
        sub.on("event", (ev) => out({k: "sub_event", sub: name, subject: ev.subject, data: {n: ev.data.n}, cursor: ev.cursor}));
        sub.on("subscribed", (s) => out({k: "sub_subscribed", sub: name, cursor: s.cursor, state: s === sub ? "same" : "other"}));
        sub.on("gap", (g) => out({k: "sub_gap", sub: name, reason: g.reason, cursor: g.cursor, state: g.subscription === sub ? "same" : "other"}));
        sub.on("error", (e) => out({k: "sub_error", sub: name, code: e.code, message: e.message, state: e.subscription === sub ? "same" : "other"}));
      }
      if (c.iterate) void iterate(sub, c, out);
      if (c.ready) {
        const start = performance.now();
        try {
          const got = await sub.ready(c.timeout);
          out({k: "sub_ready", sub: name, state: got === sub ? "same" : "other", cursor: sub.cursor, data: ms(start)});
        } catch (e) {
          out({k: "sub_ready_error", sub: name, code: e.code, message: e.message, state: state(sub), data: ms(start)});
        }
      }
      return true;
    }
    case "abort":
      aborts.get(name).abort();
      out({k: "aborted", sub: name, state: state(subs.get(name))});
      return true;
    case "resume":
      pauses.get(name)();
      return true;
    case "publish": {
      const options = {};
      if (c.timeout !== undefined) options.timeout = c.timeout;
      const signal = signalFor(c);
      if (signal) options.signal = signal;
      const start = performance.now();
      const p = Object.keys(options).length > 0 ? client.publish(c.subject, c.data, options) : client.publish(c.subject, c.data);
      try {
        const cursor = await p;
        out({k: "published", sub: name, cursor, data: ms(start)});
      } catch (e) {
        out({k: "publish_error", sub: name, code: e.code, message: e.message, data: ms(start)});
      }
      return true;
    }
    case "heap": {
      v8.setFlagsFromString("--expose-gc");
      vm.runInNewContext("gc")();
      out({k: "heap", data: {n: process.memoryUsage().heapUsed}});
      return true;
    }
    case "reconnect":
      client.reconnect();
      return true;
    default:
      return false;
  }
}

// iterate reads sub with for await, printing each event; it pauses after
// c.pauseAfter events until a resume command, and breaks out after
// c.breakAfter.
async function iterate(sub, c, out) {
  const name = c.name;
  let n = 0;
  try {
    for await (const ev of sub) {
      n++;
      out({k: "iter", sub: name, subject: ev.subject, data: {n: ev.data.n}, cursor: ev.cursor});
      if (n === c.pauseAfter) {
        out({k: "paused", sub: name, data: {n}});
        await new Promise((resolve) => pauses.set(name, resolve));
      }
      if (n === c.breakAfter) break;
    }
    out({k: "iter_end", sub: name, state: state(sub)});
  } catch (e) {
    out({k: "iter_end", sub: name, code: e.code, message: e.message, state: state(sub)});
  }
}
