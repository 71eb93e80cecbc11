// run.mjs: one fanwire.js client in Node, driven by fanwire's Go tests
// (gateway/clientjs_test.go). argv[2] is a JSON config:
//   {"urls": [...], "subs": [{"pattern": "app.>", "from"?, "resync"?, "durable"?}],
//    "getToken"?: true, "token"?: "...", "options"?: {connect options},
//    "busyMs"?: ms each event keeps the app busy,
//    "stallFile"?: a path: the first event blocks the app (no socket reads)
//    until that file exists,
//    "clockSkewMs"?: ms added to Date.now (a client clock off the gateway's)}
// It prints one JSON object per line (an event's data as its n only):
// {"k":"state"|"event"|"subscribed"|"gap"|"error"|
// "token"|"published"|"closed", ...}; "token" asks for a token, answered
// on stdin. stdin takes one JSON command per line: {"cmd":"token","token"},
// {"cmd":"close"} (and exit; with "stay": true, go on), and api.mjs's
// ({"cmd":"publish","subject","data"}, and those of the promise and
// iterator API) and presence.mjs's (track, untrack, members, room). A
// command that throws prints {"k":"cmd_error"}.
import {connect} from "../../client/fanwire.js";
import {handle} from "./api.mjs";
import {handlePresence} from "./presence.mjs";
import {WebSocket} from "ws";
import {createInterface} from "node:readline";
import {existsSync} from "node:fs";

const cfg = JSON.parse(process.argv[2]);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
if (cfg.clockSkewMs) {
  const realNow = Date.now;
  Date.now = () => realNow() + cfg.clockSkewMs;
}

const tokenWaiters = [];
const options = {...(cfg.options || {}), WebSocket};
if (cfg.token) options.token = cfg.token;
if (cfg.getToken) {
  options.getToken = () => new Promise((resolve) => {
    tokenWaiters.push(resolve);
    out({k: "token"});
  });
}
const client = connect(cfg.urls, options);
client.on("state", (state, d) => out({k: "state", state, code: d.code, reason: d.reason, url: d.url, conn: d.connectionId}));
client.on("error", (e) => out({k: "error", code: e.code, message: e.message, sub: e.subscription ? e.subscription.id : undefined, subject: e.subject, retrying: e.retrying}));
client.on("subscribed", (s) => out({k: "subscribed", sub: s.id}));
client.on("gap", (g) => out({k: "gap", sub: g.subscription.id, reason: g.reason, cursor: g.cursor}));
for (const s of cfg.subs || []) {
  const sub = client.subscribe(s.pattern, s, (ev) => {
    if (cfg.busyMs) { // a slow app: the gateway's mailbox for it overflows
      const until = performance.now() + cfg.busyMs;
      while (performance.now() < until);
    }
    out({k: "event", sub: sub.id, subject: ev.subject, data: {n: ev.data.n}, cursor: ev.cursor});
    if (cfg.stallFile) { // an app stuck: nothing is read until the test says
      const file = cfg.stallFile;
      cfg.stallFile = undefined;
      while (!existsSync(file));
    }
  });
}

createInterface({input: process.stdin}).on("line", async (line) => {
  const c = JSON.parse(line);
  try {
    switch (c.cmd) {
      case "token":
        tokenWaiters.shift()(c.token);
        break;
      case "close":
        await client.close();
        out({k: "closed"});
        if (!c.stay) process.exit(0);
        break;
      default:
        if (!(await handle(client, c, out)) && !(await handlePresence(client, c, out))) out({k: "cmd_error", message: "unknown command " + line});
    }
  } catch (e) {
    out({k: "cmd_error", message: String(e && e.stack ? e.stack : e)});
  }
}).on("close", async () => {
  await client.close();
  process.exit(0);
});
