// bench.mjs: the client's own cost per event in Node, for fanwire's
// BenchmarkClient (gateway/clientjs_bench_test.go). argv[2]: the /ws URL.
// It subscribes to app.> live and counts events; on each stdin line it
// prints what it measured since the previous one:
//   {"events", "ms" (wall), "cpuMs" (this process: user + system),
//    "handlerMs" (time inside the socket's onmessage: the client's parsing
//    and dispatch, and the app's counting), "lastN"}
import {connect} from "../../client/fanwire.js";
import {WebSocket} from "ws";
import {createInterface} from "node:readline";
import {performance} from "node:perf_hooks";

let handlerMs = 0;
// Timed is the ws WebSocket with its onmessage timed.
class Timed extends WebSocket {
  set onmessage(fn) {
    super.onmessage = fn && ((ev) => {
      const t0 = performance.now();
      fn(ev);
      handlerMs += performance.now() - t0;
    });
  }
  get onmessage() {
    return super.onmessage;
  }
}

let events = 0, lastN = -1;
const client = connect(process.argv[2], {WebSocket: Timed});
client.on("subscribed", () => process.stdout.write(JSON.stringify({subscribed: true}) + "\n"));
client.on("error", (e) => process.stderr.write("error " + e.code + " " + e.message + "\n"));
client.subscribe("app.>", (ev) => {
  events++;
  lastN = ev.data.n;
});

let t0 = performance.now(), cpu0 = process.cpuUsage(), e0 = 0, h0 = 0;
createInterface({input: process.stdin}).on("line", () => {
  const t = performance.now(), cpu = process.cpuUsage(cpu0);
  process.stdout.write(JSON.stringify({events: events - e0, ms: t - t0, cpuMs: (cpu.user + cpu.system) / 1000, handlerMs: handlerMs - h0, lastN}) + "\n");
  t0 = t; cpu0 = process.cpuUsage(); e0 = events; h0 = handlerMs;
}).on("close", async () => {
  await client.close();
  process.exit(0);
});
