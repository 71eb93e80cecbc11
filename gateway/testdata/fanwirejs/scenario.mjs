// scenario.mjs: fanwire.js in Node, one scenario of the client's defect
// tests (gateway/clientjs_defects_test.go) per process. argv[2] is a JSON
// config: {"scenario": "close" | "publishes" | "subs" | "many" |
// "hangToken" | "handler", "url": ws URL, "nativeWebSocket"?: true (Node's
// own WebSocket, node --experimental-websocket; else the ws package),
// "options"?: {connect options}, and what the scenario reads below}.
// It prints one JSON object per line, as run.mjs does ({"k": "state" |
// "event" | "error" | "published" | "publish_error" | ...}, "client": the
// client's index where a scenario runs several).
//
// "close" and "handler" must end by themselves: they never read stdin and
// never call process.exit, so that whatever the client leaves behind (a
// socket, a timer, a ping interval) keeps the process alive, and a crash
// shows as its exit code. The others run until stdin closes.
import {connect} from "../../client/fanwire.js";

const cfg = JSON.parse(process.argv[2]);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const WebSocket = cfg.nativeWebSocket ? globalThis.WebSocket : (await import("ws")).WebSocket;
if (typeof WebSocket !== "function") throw new Error("no WebSocket (Node's own needs --experimental-websocket on Node 20)");

// open connects a client that prints its states and errors.
function open(options = {}, client = 0, url = cfg.url) {
  const c = connect(url, {...(cfg.options || {}), ...options, WebSocket});
  c.on("state", (state, d) => out({k: "state", client, state, code: d.code, reason: d.reason, url: d.url}));
  c.on("error", (e) => out({k: "error", client, code: e.code, message: e.message, sub: e.subscription ? e.subscription.id : undefined, retrying: e.retrying}));
  return c;
}

// untilStdinEnds keeps the process until the test closes stdin, then
// closes the clients and exits.
function untilStdinEnds(clients) {
  process.stdin.on("data", () => {});
  process.stdin.on("end", async () => {
    await Promise.all(clients.map((c) => c.close()));
    process.exit(0);
  });
}

switch (cfg.scenario) {
  case "close":
    closeScenario(cfg.when);
    break;

  case "publishes": {
    // One client subscribes to subject, then publishes {"n": 0..count-1}
    // to it all at once, and once all are answered a marker, {"n": count};
    // it prints each publish's outcome and each event.
    const c = open();
    let started = false;
    c.subscribe(cfg.subject, {}, (ev) => out({k: "event", subject: ev.subject, data: {n: ev.data.n}}));
    const publish = (n) => c.publish(cfg.subject, {n}).then(
      (cursor) => out({k: "published", cursor, data: {n}}),
      (e) => out({k: "publish_error", code: e.code, message: e.message, data: {n}}),
    );
    c.on("subscribed", async () => {
      if (started) return;
      started = true;
      const all = [];
      for (let n = 0; n < cfg.count; n++) all.push(publish(n));
      await Promise.all(all);
      publish(cfg.count);
    });
    untilStdinEnds([c]);
    break;
  }

  case "subs": {
    // count subscriptions to prefix.0, prefix.1, ...; once the gateway has
    // confirmed all of them, every one is unsubscribed at once.
    const c = open();
    const subs = [];
    const confirmed = new Set();
    c.on("subscribed", (sub) => {
      if (confirmed.has(sub.id)) return;
      confirmed.add(sub.id);
      if (confirmed.size !== cfg.count) return;
      out({k: "all_subscribed"});
      for (const s of subs) s.unsubscribe();
      out({k: "all_unsubscribed"});
    });
    for (let i = 0; i < cfg.count; i++) subs.push(c.subscribe(cfg.prefix + "." + i, {}, () => out({k: "event"})));
    untilStdinEnds([c]);
    break;
  }

  case "many": {
    // count clients of one URL, in one process.
    const clients = [];
    for (let i = 0; i < cfg.count; i++) clients.push(open({}, i));
    untilStdinEnds(clients);
    break;
  }

  case "hangToken": {
    // A getToken that never answers.
    const c = open({
      getToken: () => {
        out({k: "gettoken"});
        return new Promise(() => {});
      },
    });
    untilStdinEnds([c]);
    break;
  }

  case "handler": {
    // An onEvent that throws (cfg.kind "throw") or an async one that
    // rejects ("reject"), on an event this client publishes itself. Once
    // the error is reported, the client closes and the process ends by
    // itself; a crash ends it with another code first.
    const c = open();
    c.subscribe(cfg.subject, {}, cfg.kind === "throw"
      ? (ev) => {
        throw new Error("thrown by onEvent " + ev.data.n);
      }
      : async (ev) => {
        await null;
        throw new Error("rejected by onEvent " + ev.data.n);
      });
    let published = false;
    c.on("subscribed", () => {
      if (published) return;
      published = true;
      c.publish(cfg.subject, {n: 1}).catch((e) => out({k: "publish_error", code: e.code, message: e.message}));
    });
    c.on("error", (e) => {
      if (e.code !== "handler") return;
      out({k: "handler_error", message: e.message + " / cause: " + (e.cause && e.cause.message)});
      c.close().then(() => out({k: "done"}));
    });
    break;
  }

  default:
    throw new Error("unknown scenario " + cfg.scenario);
}

// closeScenario closes a client at the moment when names, once, and
// prints {"k": "close"} just before; the test then wants the process to
// end by itself, with no state after "closed".
function closeScenario(when) {
  // Timers the client may leave running must outlast the test's bound,
  // so that a leak is a hang, not a late exit: the default ping interval
  // (25 s) stays, connectTimeout and tokenTimeout are made longer.
  const options = {connectTimeout: 60000, tokenTimeout: 60000};
  let closed = false;
  let c;
  const close = (where) => {
    if (closed) return;
    closed = true;
    out({k: "close", reason: where});
    c.close().then(() => out({k: "close_resolved"}));
  };
  let getTokenResolve;
  if (when === "tokenPending") {
    options.getToken = () => new Promise((resolve) => {
      getTokenResolve = resolve;
      out({k: "gettoken"});
      // close while getToken has not answered, then answer: the client
      // must not open a socket for a closed client.
      setTimeout(() => {
        close("while getToken is pending");
        setTimeout(() => getTokenResolve(null), 50);
      }, 0);
    });
  }
  c = open(options, 0, when === "retrying" || when === "inDisconnected" ? cfg.deadURL : cfg.url);
  let connected = 0;
  c.on("state", (state) => {
    if (state === "connected") connected++;
    switch (when) {
      case "inConnecting":
        // connect() says its first "connecting" before a listener can be
        // there: this is the one of a reconnect.
        if (state === "connected") setTimeout(() => c.reconnect(), 0);
        if (state === "connecting") close("in the connecting listener");
        break;
      case "inConnected":
        if (state === "connected") close("in the connected listener");
        break;
      case "inDisconnected":
        if (state === "disconnected") close("in the disconnected listener");
        break;
      case "retrying":
        if (state === "disconnected") setTimeout(() => close("while waiting to retry"), 0);
        break;
      case "connected":
        if (state === "connected") setTimeout(() => close("while connected"), 0);
        break;
      case "twice":
        if (state === "connected") {
          setTimeout(() => {
            close("twice");
            c.close().then(() => c.close()).then(() => out({k: "closed_again"}));
          }, 0);
        }
        break;
      case "reconnectInConnected":
        // reconnect() from the listener of the first connection, close()
        // once the second is up.
        if (state === "connected" && connected === 1) c.reconnect();
        if (state === "connected" && connected === 2) setTimeout(() => close("after reconnect() in the connected listener"), 0);
        break;
    }
  });
  switch (when) {
    case "connecting":
      close("right after connect");
      break;
    case "inError":
      c.on("error", () => close("in the error listener"));
      c.subscribe("app..bad", {}, () => {});
      break;
    case "inSubscribed":
      c.on("subscribed", () => close("in the subscribed listener"));
      c.subscribe(cfg.subject, {}, () => {});
      break;
    case "inSubSubscribed": // a subscription's own listener (the API of issue 24)
      c.subscribe(cfg.subject, {}, () => {}).on("subscribed", () => close("in the subscription's subscribed listener"));
      break;
    case "inEvent": {
      let published = false;
      c.subscribe(cfg.subject, {}, () => close("in onEvent"));
      c.on("subscribed", () => {
        if (published) return;
        published = true;
        // It may be answered, or rejected by the close.
        c.publish(cfg.subject, {n: 1}).catch(() => {});
      });
      break;
    }
  }
}
