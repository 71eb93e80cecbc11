// view.mjs: fanwire.js's live views (client.view) and filtered
// subscriptions in Node, for fanwire's Go tests
// (gateway/clientjs_view_test.go). argv[2] is a JSON config:
// {"urls": [...], "options"?: {connect options}}.
// It prints one JSON object per line, as run.mjs does (gateway's jsLine):
//   {"k":"state"|"error"|"gap"|"subscribed", ...} from the client;
//   {"k":"sent", "message": frame} for every subscribe the client sends, as
//     it hands it to its WebSocket (what goes on the wire);
//   for a view named sub:
//     {"k":"view", sub, subject: the id of its subscription} when made
//     {"k":"cursor", sub, cursor: view.cursor} when the connection ends
//     {"k":"change", sub, state: "upsert"|"remove", subject: key,
//      message: the doc as JSON, cursor: view.cursor}
//     {"k":"synced", sub, cursor, message: view.docs as a JSON object,
//      data.n: its size}
//     {"k":"view_ready"|"view_ready_error", sub, code?} (view.ready())
//     {"k":"view_error", sub, code, message, state: "closed"|"open"}
//     {"k":"docs", sub, cursor, message: view.docs as JSON, data.n: size,
//      state} (the "docs" command)
//   for a subscription named sub:
//     {"k":"event", sub, subject, cursor, message: data as JSON}
//     {"k":"leave", sub, subject, cursor, state: sub.cursor === cursor ? "advanced" : sub.cursor}
//     {"k":"sub_synced", sub, cursor, message: keys as JSON (absent: none)}
// stdin takes one JSON command per line:
//   {"cmd":"view","name","pattern","where"?,"ready"?: true}
//   {"cmd":"subscribe","name","pattern","options"}
//   {"cmd":"docs","name"}, {"cmd":"close","name"} (a view: view.close())
// A command that throws prints {"k":"cmd_error","message"}. The process
// ends when stdin closes.
import {connect} from "../../client/fanwire.js";
import {WebSocket} from "ws";
import {createInterface} from "node:readline";

const cfg = JSON.parse(process.argv[2]);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

// Recording is the ws package's WebSocket, printing each subscribe sent.
class Recording extends WebSocket {
  send(data, ...rest) {
    if (typeof data === "string" && data.startsWith('{"type":"subscribe"')) out({k: "sent", message: data});
    return super.send(data, ...rest);
  }
}

const views = new Map(); // name -> View
const client = connect(cfg.urls, {...(cfg.options || {}), WebSocket: Recording});
client.on("state", (state, d) => {
  out({k: "state", state, code: d.code, reason: d.reason, url: d.url});
  // The cursor each view resumes from: its next subscribe must carry it.
  if (state === "disconnected") for (const [name, view] of views) out({k: "cursor", sub: name, cursor: view.cursor});
});
client.on("error", (e) => out({k: "error", code: e.code, message: e.message, sub: e.subscription ? e.subscription.id : undefined}));
client.on("subscribed", (s) => out({k: "subscribed", sub: s.id, cursor: s.cursor}));
client.on("gap", (g) => out({k: "gap", sub: g.subscription.id, reason: g.reason, cursor: g.cursor}));

const docsJSON = (view) => JSON.stringify(Object.fromEntries([...view.docs].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))));

async function handle(c) {
  const name = c.name;
  switch (c.cmd) {
    case "view": {
      const view = client.view(c.pattern, c.where === undefined ? {} : {where: c.where});
      views.set(name, view);
      out({k: "view", sub: name, subject: view.subscription.id});
      view.on("change", (ch) => out({k: "change", sub: name, state: ch.type, subject: ch.key, message: JSON.stringify(ch.doc), cursor: view.cursor}));
      view.on("synced", (v) => out({k: "synced", sub: name, cursor: v.cursor, message: docsJSON(v), data: {n: v.docs.size}}));
      view.on("error", (e) => out({k: "view_error", sub: name, code: e.code, message: e.message, state: view.closed ? "closed" : "open"}));
      if (c.ready) {
        try {
          await view.ready();
          out({k: "view_ready", sub: name});
        } catch (e) {
          out({k: "view_ready_error", sub: name, code: e.code, message: e.message});
        }
      }
      return;
    }
    case "subscribe": {
      const sub = client.subscribe(c.pattern, c.options || {}, (ev) => out({k: "event", sub: name, subject: ev.subject, cursor: ev.cursor, message: JSON.stringify(ev.data)}));
      sub.on("leave", (subject, cursor) => out({k: "leave", sub: name, subject, cursor, state: sub.cursor === cursor ? "advanced" : String(sub.cursor)}));
      sub.on("synced", (cursor, keys) => out({k: "sub_synced", sub: name, cursor, message: keys === undefined ? undefined : JSON.stringify(keys)}));
      return;
    }
    case "docs": {
      const view = views.get(name);
      out({k: "docs", sub: name, cursor: view.cursor, message: docsJSON(view), data: {n: view.docs.size}, state: view.closed ? "closed" : "open"});
      return;
    }
    case "close":
      views.get(name).close();
      return;
    default:
      throw new Error("unknown command " + JSON.stringify(c));
  }
}

createInterface({input: process.stdin}).on("line", async (line) => {
  try {
    await handle(JSON.parse(line));
  } catch (e) {
    out({k: "cmd_error", message: String(e && e.stack ? e.stack : e)});
  }
}).on("close", async () => {
  await client.close();
  process.exit(0);
});
