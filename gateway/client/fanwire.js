// fanwire.js: the client for fanwire's native WebSocket protocol, for
// browsers and Node. One ES module, no dependencies. Every fanwire node
// serves it at /fanwire.js (and its types at /fanwire.d.ts):
//
//	import {connect} from "https://gateway.example.com/fanwire.js";
//	const client = connect("wss://gateway.example.com/ws", {getToken});
//	const sub = client.subscribe("orders.*");
//	for await (const event of sub) console.log(event.subject, event.data);
//	const open = client.view("db.orders.*", {where: "doc.status == 'open'"});
//	await open.ready(); // open.docs: subject -> document, kept up to date
//	await client.track("room.1", {name: "ann"}); // a member, resumed after every reconnect
//	const room = client.presence("room.1", {onChange}); // room.members: conn -> member
//
// The client reconnects by itself (exponential backoff with full jitter,
// which starts again only once a connection has stayed up), subscribes
// again after every reconnect from each subscription's last cursor on
// durable brokers (no gap, no duplicate), tells the app with a "gap" event
// where events may have been missed (Core NATS, an expired cursor), paces
// everything it sends under the limits the gateway announces (resending in
// order what the gateway dropped), checks sizes before sending, and
// refreshes tokens before they expire, by the gateway's clock. Presence:
// what it tracks it resumes on every new connection (the same member, the
// newest state; after a rate_limited, a second later), and a room lists
// the members again after every reconnect and tells the difference. It
// holds nothing without a bound: one record per subscription and per
// tracked subject, per publish and members request not yet answered (at
// most maxQueued each) and per event an iterator has not taken yet (at
// most its buffer). The protocol, the reconnect policy and the guarantees
// per broker are in the repository's docs/client.md and docs/protocol.md.

/** The default reconnect backoff: the n-th retry in a row waits a random
 * time in [0, min(max, initial * 2^n)] ms ("full jitter"). */
export const DEFAULT_BACKOFF = Object.freeze({ initial: 500, max: 30000 });

// Close codes the gateway sends (docs/protocol.md).
const CLOSE_NORMAL = 1000; // also ours: close()
const CLOSE_GOING_AWAY = 1001; // node draining
const CLOSE_TOKEN_EXPIRED = 4001; // token expired without a refresh: new token, reconnect
const CLOSE_SLOW_CONSUMER = 4008; // the client fell behind: reconnect with backoff, resume
const CLOSE_UNAUTHORIZED = 4401; // the token was refused: final unless getToken gives another
const CLOSE_FORBIDDEN = 4403; // refused: final
const CLOSE_DROPPED = 4000; // ours: we dropped the connection (silent, never ready, reconnect())

const STABLE_AFTER = 10000; // ms a connection stays ready before the backoff starts again
const RATE_PAUSE = 1100; // ms after a rate_limited: the gateway sheds for a second
const MIN_REFRESH_GAP = 5000; // ms between two refreshes, at least
const MAX_TIMER = 2147483647; // setTimeout's largest delay; longer ones are chained
const DEFAULT_LIMITS = Object.freeze({ frame: 65536, data: 1 << 20, rate: 100, burst: 200 });

/** An error the gateway or the client reports. code is the protocol's error
 * code (docs/protocol.md) or one of the client's own: "closed",
 * "disconnected", "queue_full", "socket", "unauthorized", "bad_message",
 * "too_large", "timeout", "aborted", "handler". */
export class FanwireError extends Error {
  constructor(code, message, extra) {
    super(message);
    this.name = "FanwireError";
    this.code = code;
    if (extra) Object.assign(this, extra);
  }
}

/**
 * connect opens a client to a fanwire node's /ws. urls is one URL or
 * several (nodes of one cluster), tried in turn: after a failed attempt or
 * a closed connection the next one is used.
 *
 * @param {string | string[]} urls ws:// or wss:// URLs of /ws
 * @param {object} [options] see fanwire.d.ts
 * @returns {Client}
 */
export function connect(urls, options = {}) {
  return new Client(urls, options);
}

/** A connection to fanwire that stays up: see connect. */
export class Client {
  #urls;
  #opts;
  #WS;
  #ws = null; // the current socket, or null
  #closing = new Map(); // socket we dropped -> its cut(), until it is closed
  #ready = false; // the current socket got "ready"
  #readyAt = 0;
  #state = "connecting";
  #urlIndex = 0;
  #attempt = 0; // connection attempts since a connection last stayed up
  #retryTimer = null;
  #connectTimer = null;
  #pingTimer = null;
  #pongTimer = null;
  #refreshTimer = null;
  #sendTimer = null;
  #lastHeard = 0;
  #token;
  #tokenAt = 0; // when #token was received (ms, local clock)
  #tokenRefused = false; // the last connection was refused for its token
  #lastRefresh = -Infinity;
  #refreshFails = 0;
  #history = false; // the node's broker keeps history (cursors)
  #limits = DEFAULT_LIMITS;
  #skew = null; // the gateway's clock minus ours (ms), once known
  #listeners = { state: new Set(), error: new Set(), gap: new Set(), subscribed: new Set() };
  #readyWaiters = new Set();
  #subs = new Map(); // id -> Subscription, in subscribe order
  #nextSub = 1;
  #pubs = new Map(); // id -> pending publish, in publish order
  #nextMsg = 1;
  #unsubs = new Map(); // id -> unsubscribe not yet answered
  #inflight = new Map(); // subscription id -> kinds sent on it and not answered ("sub", "unsub"), in order
  #outbox = []; // messages waiting to be sent, in seq order
  #seq = 0;
  #tokens = 0; // the send pacer's bucket
  #tokensAt = 0;
  #pausedUntil = 0;
  #generation = 0; // counts sockets, so late callbacks of an old one are ignored
  // Presence (track, untrack, members): see track.
  #tracks = new Map(); // subject -> presence record {subject, want, json, ver, done, good, member, key, secret, inflight, queued, waiters}
  #presIds = new Map(); // id of a track or untrack sent on this connection -> its record
  #presPausedUntil = 0; // no track or untrack is sent before (a rate_limited came)
  #presTimer = null;
  #presWaiting = new Set(); // records to send once the pause is over
  #members = new Map(); // id -> members request not answered yet

  constructor(urls, options) {
    this.#urls = (Array.isArray(urls) ? urls : [urls]).map(String);
    if (this.#urls.length === 0) throw new TypeError("fanwire: connect needs at least one URL");
    const o = options || {};
    this.#opts = {
      backoff: { ...DEFAULT_BACKOFF, ...(o.backoff || {}) },
      getToken: o.getToken,
      connectTimeout: o.connectTimeout ?? 10000,
      pingInterval: o.pingInterval ?? 25000,
      pongTimeout: o.pongTimeout ?? 10000,
      tokenTimeout: o.tokenTimeout ?? 10000,
      publishTimeout: o.publishTimeout ?? 0,
      messageRate: o.messageRate, // undefined: half the gateway's
      messageBurst: o.messageBurst,
      maxQueued: o.maxQueued ?? 1000,
    };
    this.#setToken(o.token);
    this.#WS = o.WebSocket || globalThis.WebSocket;
    if (typeof this.#WS !== "function") {
      throw new TypeError("fanwire: no WebSocket here: pass one as options.WebSocket (Node 20: the ws package)");
    }
    this.#tokens = this.#burst();
    this.#tokensAt = Date.now();
    this.#start();
  }

  /** The connection's state: "connecting", "connected", "disconnected" or "closed". */
  get state() {
    return this.#state;
  }

  /** The URL of the node in use (or being tried). */
  get url() {
    return this.#urls[this.#urlIndex];
  }

  /**
   * on registers fn for "state" (fn(state, detail)), "error" (fn(err)),
   * "gap" (fn(gap)) or "subscribed" (fn(subscription)). It returns a
   * function that removes it.
   */
  on(name, fn) {
    return addListener(this.#listeners, name, fn);
  }

  /** ready resolves once the client is connected (at once if it is); it
   * rejects with "closed" if the client closes first, "timeout" after
   * timeout ms when given. */
  ready(timeout) {
    if (this.#state === "connected") return Promise.resolve();
    if (this.#state === "closed") return Promise.reject(closedError());
    return waitFor(this.#readyWaiters, timeout, "connected");
  }

  /**
   * subscribe delivers every event matching pattern, once, in order,
   * across reconnects: to onEvent, to the subscription's "event"
   * listeners, and to its async iterator. options: where (a filter, a
   * CEL expression over each event, sent with every subscribe), from (a
   * cursor, "first", or "latest": the newest event of each subject, then
   * live), durable (a durable consumer's name, JetStream), resync ("live",
   * "first" or "latest": where to go on when a cursor has expired), signal
   * (an AbortSignal that unsubscribes), buffer (events an iterator holds
   * at most, default 1000).
   */
  subscribe(pattern, options, onEvent) {
    if (typeof options === "function") [options, onEvent] = [{}, options];
    if (onEvent !== undefined && onEvent !== null && typeof onEvent !== "function") {
      throw new TypeError("fanwire: subscribe's onEvent must be a function");
    }
    if (this.#state === "closed") throw closedError();
    const o = options || {};
    if (o.resync !== undefined && o.resync !== null && o.resync !== "live" && o.resync !== "first" && o.resync !== "latest") {
      throw new TypeError('fanwire: resync is "live", "first" or "latest"');
    }
    if (o.where !== undefined && o.where !== null && typeof o.where !== "string") {
      throw new TypeError("fanwire: where is a string (a CEL expression)");
    }
    if (o.presence && ((o.from !== undefined && o.from !== null) || (o.durable !== undefined && o.durable !== null))) {
      throw new TypeError("fanwire: a presence subscription starts live: it takes no from and no durable");
    }
    const sub = new Subscription(this, "s" + this.#nextSub++, String(pattern), o, onEvent || null);
    if (o.signal && o.signal.aborted) {
      sub._end(new FanwireError("aborted", "fanwire: the subscription's signal was aborted"));
      return sub;
    }
    this.#subs.set(sub.id, sub);
    this.#enqueue("sub", sub.id);
    return sub;
  }

  /**
   * view keeps view.docs, a Map of subject -> document, equal to the
   * newest document of every subject matching pattern (that passes
   * options.where), across reconnects: see View. options: where (a CEL
   * expression), signal (an AbortSignal that closes the view). It needs a
   * broker with history (JetStream, Redis Streams).
   */
  view(pattern, options) {
    if (this.#state === "closed") throw closedError();
    const o = options || {};
    if (o.where !== undefined && o.where !== null && typeof o.where !== "string") {
      throw new TypeError("fanwire: where is a string (a CEL expression)");
    }
    return new View(this, String(pattern), o);
  }

  /**
   * publish sends data (any JSON value) to subject over the connection,
   * which needs a token with a publish grant (or a gateway that lets
   * anonymous connections publish). It resolves with the event's cursor on
   * durable brokers (undefined on Core NATS) once the broker has it, and
   * rejects with a FanwireError: the gateway's code (forbidden,
   * bad_subject, too_large, broker_unavailable, ...), "disconnected" when
   * the connection ended before the answer (the event may or may not have
   * been published), "queue_full", "closed", "too_large" (checked before
   * sending), "timeout" or "aborted" (options.timeout, options.signal).
   * While disconnected, it waits for the next connection.
   */
  publish(subject, data, options) {
    if (this.#state === "closed") return Promise.reject(closedError());
    const o = options || {};
    if (o.signal && o.signal.aborted) return Promise.reject(new FanwireError("aborted", "fanwire: the publish's signal was aborted"));
    if (this.#pubs.size >= this.#opts.maxQueued) {
      return Promise.reject(new FanwireError("queue_full", "fanwire: " + this.#opts.maxQueued + " publishes are already waiting (maxQueued)"));
    }
    let json;
    try {
      json = JSON.stringify(data);
    } catch (e) {
      return Promise.reject(new FanwireError("bad_message", "fanwire: data is not JSON: " + errText(e)));
    }
    if (json === undefined) return Promise.reject(new FanwireError("bad_message", "fanwire: data must be a JSON value"));
    const id = "p" + this.#nextMsg++;
    const frame = '{"type":"publish","id":"' + id + '","subject":' + JSON.stringify(String(subject)) + ',"data":' + json + "}";
    return new Promise((resolve, reject) => {
      const p = { frame, dataLen: json.length, resolve, reject, sent: false, done: null };
      const end = (err) => {
        if (this.#pubs.get(id) !== p) return;
        this.#pubs.delete(id);
        this.#unqueue(id);
        p.done();
        reject(err);
      };
      const timeout = o.timeout ?? this.#opts.publishTimeout;
      const timer = timeout > 0 ? setTimeout(() => end(new FanwireError("timeout", "fanwire: no answer within " + timeout + " ms" + (p.sent ? ": the event may or may not have been published" : ": not sent"), { id })), Math.min(timeout, MAX_TIMER)) : null;
      const onAbort = () => end(new FanwireError("aborted", "fanwire: the publish was aborted" + (p.sent ? " after it was sent: the event may or may not have been published" : " before it was sent"), { id }));
      if (o.signal) o.signal.addEventListener("abort", onAbort, { once: true });
      p.done = () => {
        clearTimeout(timer);
        if (o.signal) o.signal.removeEventListener("abort", onAbort);
      };
      this.#pubs.set(id, p);
      this.#enqueue("pub", id);
    });
  }

  /**
   * track makes this connection a member of subject (a concrete subject)
   * with state (any JSON value, or none), or updates its state. It
   * resolves with the member's key (its conn in members and presence
   * messages) once the gateway confirms ("tracked") this state or a newer
   * one, and rejects with the gateway's code (forbidden, too_large,
   * too_many_tracks, bad_subject, ...), "bad_message" (state is not JSON),
   * "aborted" (untracked before it was confirmed) or "closed".
   *
   * The client keeps the newest state of each subject it tracks and the
   * member's resume secret, and tracks it again on every new connection
   * with the secret: the gateway hands the membership over (same key, no
   * leave and no join; an update if the state changed meanwhile), or,
   * when the secret has expired, makes a new member. At most one track per
   * subject is on its way: states given meanwhile are coalesced into the
   * newest. After a rate_limited, the newest state is sent again once a
   * second has passed. A refused state leaves the last accepted one (or
   * none) as what is tracked again.
   */
  track(subject, state) {
    if (this.#state === "closed") return Promise.reject(closedError());
    let json;
    if (state !== undefined) {
      try {
        json = JSON.stringify(state);
      } catch (e) {
        return Promise.reject(new FanwireError("bad_message", "fanwire: state is not JSON: " + errText(e)));
      }
      if (json === undefined) return Promise.reject(new FanwireError("bad_message", "fanwire: state must be a JSON value"));
    }
    subject = String(subject);
    let rec = this.#tracks.get(subject);
    if (!rec) {
      rec = { subject, want: "track", json, ver: 0, done: 0, good: NO_STATE, member: false, key: undefined, secret: undefined, inflight: null, queued: false, waiters: [] };
      this.#tracks.set(subject, rec);
    }
    if (rec.want === "untrack") {
      // The untrack is superseded: the member stays (or comes back).
      settleRec(rec, rec.ver, null);
      rec.want = "track";
    }
    rec.json = json;
    rec.ver++;
    return new Promise((resolve, reject) => {
      rec.waiters.push({ ver: rec.ver, resolve, reject });
      this.#presSend(rec);
    });
  }

  /**
   * untrack ends this connection's membership of subject, and the client
   * forgets its state and secret (nothing is tracked again after a
   * reconnect). It resolves once the gateway confirms ("untracked"), at
   * once when the current connection is not a member (while disconnected:
   * the membership the last connection held then leaves when the gateway's
   * grace for it ends); a track of subject not confirmed yet rejects with
   * "aborted".
   */
  untrack(subject) {
    if (this.#state === "closed") return Promise.reject(closedError());
    subject = String(subject);
    const rec = this.#tracks.get(subject);
    if (!rec) return Promise.resolve();
    if (rec.want === "track") {
      settleRec(rec, rec.ver, new FanwireError("aborted", "fanwire: untracked before the track was confirmed"));
      rec.want = "untrack";
      rec.json = undefined;
      rec.ver++;
    }
    if (!this.#ready || (!rec.member && rec.inflight === null)) {
      // The gateway holds no member of this connection (a new connection
      // tracks only what the client remembers).
      this.#tracks.delete(subject);
      this.#unqueue(presKey(subject));
      settleRec(rec, rec.ver, null);
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      rec.waiters.push({ ver: rec.ver, resolve, reject });
      this.#presSend(rec);
    });
  }

  /**
   * members asks for one page of subject's members (a concrete subject;
   * the connection needs a subscribe grant on it), in the order of their
   * keys (conn): options.after, the previous page's next; options.limit,
   * 1 to 1000 (the gateway's default: 100). It resolves with {count, members:
   * [{conn, sub, state}], next} (next undefined on the last page) and
   * rejects with the gateway's code, "disconnected" (the connection ended
   * before the answer: ask again), "queue_full" or "closed". While
   * disconnected, it waits for the next connection.
   */
  members(subject, options) {
    if (this.#state === "closed") return Promise.reject(closedError());
    const o = options || {};
    if (o.limit !== undefined && o.limit !== null && !(Number.isInteger(o.limit) && o.limit >= 1 && o.limit <= 1000)) {
      return Promise.reject(new TypeError("fanwire: members' limit is an integer from 1 to 1000"));
    }
    if (this.#members.size >= this.#opts.maxQueued) {
      return Promise.reject(new FanwireError("queue_full", "fanwire: " + this.#opts.maxQueued + " members requests are already waiting (maxQueued)"));
    }
    const id = "m" + this.#nextMsg++;
    const m = { type: "members", id, subject: String(subject) };
    if (o.after !== undefined && o.after !== null && o.after !== "") m.after = String(o.after);
    if (o.limit !== undefined && o.limit !== null) m.limit = o.limit;
    const frame = JSON.stringify(m);
    return new Promise((resolve, reject) => {
      this.#members.set(id, { frame, resolve, reject, sent: false, seq: 0 });
      this.#enqueue("members", id);
    });
  }

  /**
   * presence keeps room.members, a Map of conn -> member ({conn, sub,
   * state}), equal to subject's members, across reconnects: see
   * PresenceRoom. options: onChange (fn({joins, leaves, updates, count})),
   * pageSize (members per page while listing, 1 to 1000, default 100),
   * signal (an AbortSignal that closes the room).
   */
  presence(subject, options) {
    if (this.#state === "closed") throw closedError();
    const o = options || {};
    if (o.onChange !== undefined && o.onChange !== null && typeof o.onChange !== "function") {
      throw new TypeError("fanwire: presence's onChange must be a function");
    }
    const size = o.pageSize ?? 100;
    if (!(Number.isInteger(size) && size >= 1 && size <= 1000)) throw new TypeError("fanwire: pageSize is an integer from 1 to 1000");
    return new PresenceRoom(this, String(subject), { ...o, pageSize: size });
  }

  /** close ends the client: no reconnect, pending publishes reject with
   * "closed". It resolves once the socket is closed. Safe in any state,
   * from any callback, and more than once. */
  close() {
    if (this.#state === "closed") return Promise.resolve();
    const ws = this.#ws;
    this.#forget();
    this.#finish({ code: CLOSE_NORMAL, reason: "closed by the client" });
    for (const cut of [...this.#closing.values()]) cut(); // dropped sockets still closing: cut now
    return ws ? this.#closeSocket(ws, CLOSE_NORMAL, "client closed", 2000) : Promise.resolve();
  }

  /** reconnect drops the current connection, if any, and connects again at
   * once (a "retry now" for an app that knows the network is back). */
  reconnect() {
    if (this.#state === "closed") return;
    this.#attempt = 0;
    if (this.#ws) {
      this.#drop("reconnect asked by the app", true);
      return;
    }
    this.#generation++; // an #open waiting for getToken gives up
    this.#schedule(0);
  }

  // ---- connecting -----------------------------------------------------------

  // #start opens a connection; nothing it meets may escape as an unhandled
  // rejection (which ends a Node process).
  #start() {
    this.#open().catch((e) => this.#emitError(new FanwireError("socket", "fanwire: connecting failed: " + errText(e), { cause: e })));
  }

  async #open() {
    const gen = ++this.#generation;
    this.#setState("connecting", { url: this.url });
    if (gen !== this.#generation) return; // a listener closed or reconnected
    if (this.#opts.getToken) {
      let token;
      try {
        token = await this.#getToken();
      } catch (e) {
        if (gen !== this.#generation) return;
        this.#emitError(new FanwireError("unauthorized", "fanwire: getToken failed: " + errText(e)));
        if (gen === this.#generation) this.#retry(false);
        return;
      }
      if (gen !== this.#generation) return; // closed meanwhile
      this.#setToken(token);
    }
    let url = this.url;
    if (this.#token) url += (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(this.#token);
    let ws;
    try {
      ws = new this.#WS(url);
    } catch (e) {
      this.#emitError(new FanwireError("socket", "fanwire: cannot open " + this.url + ": " + errText(e)));
      if (gen === this.#generation) this.#retry(false);
      return;
    }
    this.#ws = ws;
    this.#ready = false;
    this.#lastHeard = Date.now();
    ws.onmessage = (ev) => {
      if (gen === this.#generation) this.#onFrame(ev.data);
    };
    ws.onerror = () => {
      // A close event follows and says what happened, except from Node
      // 20's own WebSocket (undici), which fires only "error" for a
      // connection that failed and stays CONNECTING: a failed attempt.
      if (gen !== this.#generation || this.#ready) return;
      setTimeout(() => {
        if (gen === this.#generation && !this.#ready) this.#drop("the connection failed", false);
      }, 0);
    };
    ws.onclose = (ev) => {
      if (gen === this.#generation) this.#onClose(ev.code, ev.reason || "");
    };
    this.#connectTimer = setTimeout(() => {
      if (gen === this.#generation && !this.#ready) this.#drop("no ready within " + this.#opts.connectTimeout + " ms", false);
    }, this.#opts.connectTimeout);
  }

  // #getToken calls the app's getToken, bounded by tokenTimeout.
  #getToken() {
    const ms = this.#opts.tokenTimeout;
    const got = Promise.resolve().then(() => this.#opts.getToken());
    if (!(ms > 0)) return got;
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error("no answer within " + ms + " ms (tokenTimeout)")), ms);
    });
    return Promise.race([got, late]).finally(() => clearTimeout(timer));
  }

  #setToken(token) {
    this.#token = token === null || token === undefined ? undefined : String(token);
    this.#tokenAt = Date.now();
  }

  // #closeSocket closes ws and resolves once it has closed, or after wait
  // ms, when it is cut (the ws package's terminate) so that nothing of it
  // keeps a Node process alive.
  #closeSocket(ws, code, reason, wait) {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.#closing.delete(ws);
        ws.onclose = null;
        resolve();
      };
      const cut = () => {
        try {
          if (typeof ws.terminate === "function") ws.terminate();
        } catch {
          // already gone
        }
        done();
      };
      const t = setTimeout(cut, wait);
      if (t && typeof t.unref === "function") t.unref();
      this.#closing.set(ws, cut);
      ws.onmessage = null;
      ws.onerror = noop; // the ws package emits "error" for a socket closed while connecting
      ws.onclose = done;
      if (ws.readyState === 3) return done();
      try {
        ws.close(code, reason.slice(0, 120));
      } catch {
        cut();
      }
    });
  }

  // #forget abandons the current socket's state and every timer.
  #forget() {
    this.#clearTimers();
    clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
    this.#ws = null;
    this.#ready = false;
    this.#generation++;
    this.#outbox = [];
    this.#inflight.clear();
    this.#refreshing = null;
    // A closed connection left every subject: the next one tracks again.
    this.#presIds.clear();
    this.#presWaiting.clear();
    this.#presPausedUntil = 0;
    for (const rec of this.#tracks.values()) {
      rec.member = false;
      rec.inflight = null;
      rec.queued = false;
      rec.done = 0;
    }
  }

  // #drop abandons the current socket without waiting for its close
  // handshake (it may be dead) and goes on as if it had closed with 4000.
  #drop(reason, atOnce) {
    const ws = this.#ws;
    if (ws) this.#closeSocket(ws, CLOSE_DROPPED, reason, 1000);
    this.#onClose(CLOSE_DROPPED, reason, atOnce);
  }

  #onClose(code, reason, atOnce) {
    const wasReady = this.#ready;
    const stable = wasReady && Date.now() - this.#readyAt >= STABLE_AFTER;
    this.#forget();
    if (stable) this.#attempt = 0;
    // A publish sent and not answered may or may not be in the broker: the
    // app decides. One not sent yet waits for the next connection.
    for (const [id, p] of this.#pubs) {
      if (!p.sent) continue;
      this.#pubs.delete(id);
      p.done();
      p.reject(new FanwireError("disconnected", "fanwire: the connection closed (" + code + ") before the publish was answered: it may or may not have been published", { id }));
    }
    for (const [id, r] of this.#members) {
      if (!r.sent) continue;
      this.#members.delete(id);
      r.reject(new FanwireError("disconnected", "fanwire: the connection closed (" + code + ") before members was answered", { id }));
    }
    for (const [id, u] of this.#unsubs) {
      // The gateway forgets a connection's subscriptions, but not the
      // durable consumers they were bound to: those are deleted on the
      // next connection.
      if (u.durable === undefined || this.#subs.has(id)) this.#unsubs.delete(id);
      else {
        u.deferred = true;
        u.sent = false;
      }
    }
    for (const sub of this.#subs.values()) sub._disconnected();
    const detail = { code, reason, url: this.url };
    if (code === CLOSE_UNAUTHORIZED || code === CLOSE_FORBIDDEN) {
      // A refused token is final, unless getToken may give a better one
      // and the token that failed was not already a fresh one.
      const final = !this.#opts.getToken || this.#tokenRefused;
      this.#tokenRefused = true;
      this.#emitError(new FanwireError(code === CLOSE_FORBIDDEN ? "forbidden" : "unauthorized", "fanwire: the gateway refused the connection: " + (reason || code), { closeCode: code }));
      if (this.#state === "closed") return;
      if (final) {
        this.#finish(detail);
        return;
      }
    } else {
      this.#tokenRefused = false;
    }
    this.#setState("disconnected", detail);
    if (this.#state !== "disconnected" || this.#retryTimer !== null) return; // a listener closed or reconnected
    if (atOnce) {
      this.#schedule(0);
      return;
    }
    // A node that drains after serving us: to the next node, after the
    // backoff (0 to backoff.initial ms after a connection that stayed up),
    // so that its clients do not all arrive at once. 1001 before ready is a
    // draining node that takes no one: a failed attempt, like any other.
    if (code === CLOSE_GOING_AWAY && wasReady) this.#nextURL();
    if (code === CLOSE_SLOW_CONSUMER) this.#attempt = Math.max(this.#attempt, 1);
    this.#retry(wasReady);
  }

  // #finish ends the client (close, or a final refusal): no retry, and the
  // publishes still waiting reject with "closed".
  #finish(detail) {
    this.#forget();
    const err = new FanwireError("closed", "fanwire: the client stopped: " + (detail.reason || detail.code));
    for (const [id, p] of this.#pubs) {
      this.#pubs.delete(id);
      p.done();
      p.reject(err);
    }
    this.#unsubs.clear();
    for (const [id, r] of this.#members) {
      this.#members.delete(id);
      r.reject(err);
    }
    for (const rec of this.#tracks.values()) settleRec(rec, rec.ver, err);
    this.#tracks.clear();
    this.#setState("closed", detail);
    settle(this.#readyWaiters, err);
    for (const sub of [...this.#subs.values()]) sub._end(err);
    this.#subs.clear();
  }

  #retry(wasReady) {
    if (!wasReady) this.#nextURL();
    this.#schedule(Math.random() * this.#backoff(this.#attempt++));
  }

  #backoff(n) {
    const b = this.#opts.backoff;
    return Math.min(b.max, b.initial * 2 ** Math.min(n, 30));
  }

  #nextURL() {
    this.#urlIndex = (this.#urlIndex + 1) % this.#urls.length;
  }

  #schedule(delay) {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = null;
      if (this.#state !== "closed") this.#start();
    }, delay);
  }

  #clearTimers() {
    clearTimeout(this.#connectTimer);
    clearInterval(this.#pingTimer);
    clearTimeout(this.#pongTimer);
    clearTimeout(this.#refreshTimer);
    clearTimeout(this.#sendTimer);
    clearTimeout(this.#presTimer);
    this.#connectTimer = this.#pingTimer = this.#pongTimer = this.#refreshTimer = this.#sendTimer = this.#presTimer = null;
  }

  #setState(state, detail) {
    if (this.#state === state && state !== "disconnected") return;
    this.#state = state;
    for (const fn of this.#listeners.state) this._call(fn, state, detail);
    if (state === "connected" && this.#state === "connected") settle(this.#readyWaiters);
  }

  #emitError(err) {
    const set = this.#listeners.error;
    if (set.size === 0) {
      if (typeof console !== "undefined") (err.code === "handler" ? console.error : console.warn)(err.message, err.cause ?? "");
      return;
    }
    for (const fn of set) {
      try {
        fn(err);
      } catch (e) {
        if (typeof console !== "undefined") console.error("fanwire: an error listener threw:", e);
      }
    }
  }

  // _call runs an app callback: what it throws, or what a promise it
  // returns rejects with, is reported as an "error" (code "handler"),
  // never let through into the client's own state changes.
  _call(fn, a, b) {
    try {
      const r = fn(a, b);
      if (r && typeof r.then === "function") r.then(undefined, (e) => this._handlerError(e));
    } catch (e) {
      this._handlerError(e);
    }
  }

  _handlerError(e) {
    this.#emitError(new FanwireError("handler", "fanwire: an app callback failed: " + errText(e), { cause: e }));
  }

  _emitError(err) {
    this.#emitError(err);
  }

  _emitGap(gap) {
    for (const fn of this.#listeners.gap) this._call(fn, gap);
  }

  _emitSubscribed(sub) {
    for (const fn of this.#listeners.subscribed) this._call(fn, sub);
  }

  _history() {
    return this.#history;
  }

  _retryDelay(n) {
    return this.#backoff(n);
  }

  // ---- receiving ------------------------------------------------------------

  #onFrame(data) {
    this.#lastHeard = Date.now();
    if (typeof data !== "string") {
      this.#emitError(new FanwireError("bad_message", "fanwire: the gateway sent a binary frame"));
      return;
    }
    // The gateway may put several messages in one frame, one per line.
    const gen = this.#generation;
    let start = 0;
    for (;;) {
      const nl = data.indexOf("\n", start);
      const line = nl < 0 ? (start === 0 ? data : data.slice(start)) : data.slice(start, nl);
      if (line.length > 0) {
        let m;
        try {
          m = JSON.parse(line);
        } catch (e) {
          this.#emitError(new FanwireError("bad_message", "fanwire: not JSON from the gateway: " + e.message));
        }
        if (m && typeof m === "object") this.#onMessage(m);
        if (gen !== this.#generation) return; // the message, or an app callback, ended the connection
      }
      if (nl < 0) return;
      start = nl + 1;
    }
  }

  #onMessage(m) {
    switch (m.type) {
      case "event":
        this.#onEvent(m);
        return;
      case "leave":
        this.#onLeave(m);
        return;
      case "synced": {
        const sub = this.#subs.get(m.id);
        if (sub) sub._synced(m.cursor, Array.isArray(m.keys) ? m.keys : undefined);
        return;
      }
      case "ready":
        this.#onReady(m);
        return;
      case "subscribed": {
        this.#answered(m.id, "sub");
        const sub = this.#subs.get(m.id);
        if (sub) sub._subscribed(m.cursor);
        return;
      }
      case "unsubscribed":
        this.#answered(m.id, "unsub");
        this.#unsubbed(m.id);
        return;
      case "published": {
        const p = this.#pubs.get(m.id);
        if (p) {
          this.#pubs.delete(m.id);
          p.done();
          p.resolve(m.cursor);
        }
        return;
      }
      case "presence":
        this.#onPresence(m);
        return;
      case "tracked":
      case "untracked":
        this.#presAnswered(m.id, null, m);
        return;
      case "members": {
        const r = this.#members.get(m.id);
        if (r) {
          this.#members.delete(m.id);
          r.resolve({ subject: m.subject, count: m.count, members: Array.isArray(m.members) ? m.members : [], next: m.next || undefined });
        }
        return;
      }
      case "refreshed":
        this.#refreshing = null;
        this.#refreshFails = 0;
        this.#armRefresh();
        return;
      case "error":
        this.#onError(m);
        return;
      default: // pong, and types a newer gateway may send: nothing to do
    }
  }

  #onEvent(m) {
    const subs = m.subs;
    if (!Array.isArray(subs)) return;
    const event = m.cursor === undefined ? { subject: m.subject, data: m.data } : { subject: m.subject, data: m.data, cursor: m.cursor };
    for (let i = 0; i < subs.length; i++) {
      const sub = this.#subs.get(subs[i]);
      if (sub) sub._deliver(event);
    }
  }

  // #onPresence: changes of m.subject's members, for each of m.subs
  // (subscriptions with presence).
  #onPresence(m) {
    const subs = m.subs;
    if (!Array.isArray(subs)) return;
    const list = (v) => (Array.isArray(v) ? v : []);
    const change = { subject: m.subject, count: m.count, joins: list(m.joins), leaves: list(m.leaves), updates: list(m.updates) };
    for (let i = 0; i < subs.length; i++) {
      const sub = this.#subs.get(subs[i]);
      if (sub) sub._presence(change);
    }
  }

  // #onLeave: the document at m.subject left the view of each of m.subs
  // (filtered subscriptions).
  #onLeave(m) {
    const subs = m.subs;
    if (!Array.isArray(subs)) return;
    for (let i = 0; i < subs.length; i++) {
      const sub = this.#subs.get(subs[i]);
      if (sub) sub._leave(m.subject, m.cursor);
    }
  }

  #onReady(m) {
    clearTimeout(this.#connectTimer);
    this.#connectTimer = null;
    this.#ready = true;
    this.#readyAt = Date.now();
    this.#tokenRefused = false;
    this.#history = m.history === true;
    if (typeof m.time === "number") this.#skew = m.time - Date.now();
    const l = m.limits;
    this.#limits = l && typeof l === "object" ? { ...DEFAULT_LIMITS, ...l } : DEFAULT_LIMITS;
    this.#tokens = Math.min(this.#tokens, this.#burst());
    const gen = this.#generation;
    const { pingInterval, pongTimeout } = this.#opts;
    if (pingInterval > 0) {
      this.#pingTimer = setInterval(() => {
        if (gen !== this.#generation) return;
        const sentAt = Date.now();
        this.#take();
        this.#sendNow('{"type":"ping"}');
        clearTimeout(this.#pongTimer);
        this.#pongTimer = setTimeout(() => {
          if (gen === this.#generation && this.#lastHeard < sentAt) this.#drop("nothing heard for " + pongTimeout + " ms after a ping", false);
        }, pongTimeout);
      }, pingInterval);
    }
    this.#armRefresh();
    // Everything again, in the order the app asked for it: subscriptions
    // (from their cursors), durables to delete, then the publishes that
    // waited.
    this.#outbox = [];
    for (const sub of this.#subs.values()) if (sub._wanted()) this.#push("sub", sub.id);
    for (const rec of [...this.#tracks.values()]) {
      if (rec.want === "untrack") {
        // This connection is no member: nothing to untrack.
        this.#tracks.delete(rec.subject);
        settleRec(rec, rec.ver, null);
        continue;
      }
      rec.queued = true;
      this.#push("pres", presKey(rec.subject));
    }
    for (const [id, u] of this.#unsubs) if (u.deferred) this.#push("unsub", id);
    for (const [id, r] of this.#members) if (!r.sent) this.#push("members", id);
    for (const [id, p] of this.#pubs) if (!p.sent) this.#push("pub", id);
    this.#setState("connected", { url: this.url, connectionId: m.connection_id });
    if (gen === this.#generation) this.#flush();
  }

  #onError(m) {
    const id = m.id;
    const err = new FanwireError(m.code || "error", m.message || m.code || "error", id === undefined ? undefined : { id });
    if (id === undefined) {
      if (err.code === "rate_limited") this.#rateLimited(); // a ping
      else this.#emitError(err);
      return;
    }
    if (this.#presIds.has(id)) {
      this.#presAnswered(id, err);
      return;
    }
    const r = this.#members.get(id);
    if (r) {
      if (err.code === "rate_limited") {
        r.sent = false;
        this.#requeue("members", id, r.seq);
        return;
      }
      this.#members.delete(id);
      r.reject(err);
      return;
    }
    const p = this.#pubs.get(id);
    if (p) {
      if (err.code === "rate_limited") {
        p.sent = false; // dropped unpublished: send it again, in its place
        this.#requeue("pub", id, p.seq);
        return;
      }
      this.#pubs.delete(id);
      p.done();
      p.reject(err);
      return;
    }
    const kind = this.#answered(id, "");
    const u = this.#unsubs.get(id);
    const sub = this.#subs.get(id);
    // A subscribe's answer, or an error of the gateway's own about an
    // active subscription (revoked by a refresh).
    if (sub && sub._wanted() && kind !== "unsub") {
      if (err.code === "rate_limited") {
        sub._pending = false;
        this.#requeue("sub", id, sub._seq);
        return;
      }
      const retry = sub._failed(err);
      if (retry >= 0) this.#enqueueLater("sub", id, retry);
      return;
    }
    if (u) {
      this.#unsubError(id, u, err);
      return;
    }
    if (typeof id === "string" && id[0] === "r") {
      const r = this.#refreshing;
      if (err.code === "rate_limited" && r && r.id === id) {
        this.#requeue("refresh", id, r.seq);
        return;
      }
      this.#emitError(err); // a refused refresh: the connection ends at exp with 4001
      return;
    }
    // An answer for a subscription the app has already ended: nothing to tell.
    if (err.code === "unknown_id" || (typeof id === "string" && /^[sp][0-9]+$/.test(id))) return;
    this.#emitError(err);
  }

  // #unsubError handles an error answering an unsubscribe, or a durable
  // deletion's subscribe or unsubscribe.
  #unsubError(id, u, err) {
    switch (err.code) {
      case "rate_limited":
        u.sent = false;
        this.#requeue("unsub", id, u.seq);
        return;
      case "durable_in_use":
      case "broker_unavailable":
        u.retry = true; // the unsubscribe that follows gets unknown_id
        return;
      case "unknown_id":
        if (u.retry && u.tries < 8) {
          u.retry = false;
          u.sent = false;
          this.#enqueueLater("unsub", id, this.#backoff(u.tries++));
          return;
        }
        this.#unsubbed(id);
        return;
      case "duplicate_id":
        return; // a resend whose subscribe was already there: its unsubscribe follows
      default:
        this.#unsubs.delete(id);
    }
  }

  // #answered takes the oldest message sent on subscription id and not
  // answered yet (of kind, or any when kind is ""), and returns its kind.
  // An error names only the id, and a subscribe and an unsubscribe of one
  // id may both be on their way.
  #answered(id, kind) {
    const q = this.#inflight.get(id);
    if (!q) return "";
    const i = kind === "" ? 0 : q.indexOf(kind);
    if (i < 0) return "";
    const k = q.splice(i, 1)[0];
    if (q.length === 0) this.#inflight.delete(id);
    return k;
  }

  #sent(id, kind) {
    const q = this.#inflight.get(id);
    if (q) q.push(kind);
    else this.#inflight.set(id, [kind]);
  }

  // #unsubbed: the gateway no longer holds subscription id.
  #unsubbed(id) {
    this.#unsubs.delete(id);
    const sub = this.#subs.get(id);
    if (sub) {
      sub._pending = false;
      sub._unsubscribed(); // a pause's unsubscribe: resume if it was waiting for this
    }
  }

  // ---- sending --------------------------------------------------------------

  // #burst and #rate are the pacer's: the options', or half the gateway's
  // limits (room for pings and for frames bunched by the network), and
  // never over the gateway's limits: a client that sends more than them
  // only has messages dropped, and past --max-client-errors drops the
  // gateway closes the connection (1008).
  #burst() {
    const l = this.#limits;
    const b = this.#opts.messageBurst ?? (l.rate > 0 ? Math.max(1, Math.floor(l.burst / 2)) : Infinity);
    return l.rate > 0 ? Math.min(b, l.burst) : b;
  }

  #rate() {
    const l = this.#limits;
    const r = this.#opts.messageRate ?? (l.rate > 0 ? l.rate / 2 : 0);
    return r > 0 && l.rate > 0 ? Math.min(r, l.rate) : r; // 0: unpaced (the gateway's drops are resent)
  }

  // #enqueue queues a message for sending (when connected: on "ready"
  // otherwise, which rebuilds the queue).
  #enqueue(kind, id) {
    if (!this.#ready) return;
    this.#push(kind, id);
    this.#flush();
  }

  #push(kind, id) {
    const seq = ++this.#seq;
    this.#outbox.push({ kind, id, seq });
    this.#stamp(kind, id, seq);
  }

  #stamp(kind, id, seq) {
    if (kind === "pub") this.#pubs.get(id).seq = seq;
    else if (kind === "sub") this.#subs.get(id)._seq = seq;
    else if (kind === "unsub") this.#unsubs.get(id).seq = seq;
    else if (kind === "members") this.#members.get(id).seq = seq;
  }

  // #requeue puts back a message the gateway dropped (rate_limited) in its
  // place by seq, and pauses sending: the gateway drops everything for a
  // second after a drop, so what is resent after the pause keeps its order.
  #requeue(kind, id, seq) {
    if (!this.#ready) return;
    let i = this.#outbox.length;
    while (i > 0 && this.#outbox[i - 1].seq > seq) i--;
    if (i > 0 && this.#outbox[i - 1].seq === seq) return;
    this.#outbox.splice(i, 0, { kind, id, seq });
    this.#rateLimited();
  }

  #rateLimited() {
    this.#pausedUntil = Date.now() + RATE_PAUSE;
    this.#tokens = 0;
    this.#flush();
  }

  // #enqueueLater queues a message again after delay ms on this connection.
  #enqueueLater(kind, id, delay) {
    const gen = this.#generation;
    setTimeout(() => {
      if (gen === this.#generation) this.#enqueue(kind, id);
    }, delay);
  }

  #unqueue(id) {
    const i = this.#outbox.findIndex((e) => e.id === id);
    if (i >= 0) this.#outbox.splice(i, 1);
  }

  // #take takes a token of the pacer's bucket for a message sent outside
  // the queue (a ping), so that the queue leaves room for it.
  #take() {
    this.#refill(Date.now(), this.#rate());
    this.#tokens = Math.max(0, this.#tokens - 1);
  }

  // #refill adds the tokens earned since the last refill, up to the burst.
  #refill(now, rate) {
    this.#tokens = Math.min(this.#burst(), this.#tokens + ((now - this.#tokensAt) * rate) / 1000);
    this.#tokensAt = now;
  }

  // #flush sends what the outbox holds, paced: at most the burst at once,
  // then the rate per second (half the gateway's limits, unless the
  // options set them), paused for a second after a rate_limited.
  #flush() {
    clearTimeout(this.#sendTimer);
    this.#sendTimer = null;
    if (!this.#ready) return;
    const gen = this.#generation;
    const rate = this.#rate();
    while (this.#outbox.length > 0 && gen === this.#generation) {
      const now = Date.now();
      if (now < this.#pausedUntil) {
        this.#sendTimer = setTimeout(() => this.#flush(), this.#pausedUntil - now);
        return;
      }
      if (rate > 0) {
        this.#refill(now, rate);
        if (this.#tokens < 1) {
          this.#sendTimer = setTimeout(() => this.#flush(), Math.ceil(((1 - this.#tokens) * 1000) / rate));
          return;
        }
      }
      const e = this.#outbox.shift();
      const frames = this.#frames(e);
      if (frames === null) continue;
      if (rate > 0) this.#tokens -= frames.length;
      for (const f of frames) this.#sendNow(f);
    }
  }

  // #frames returns what to send for a queued message, or null when there
  // is nothing to send (any more). A message over the gateway's limits is
  // refused here, and the connection stays.
  #frames(e) {
    switch (e.kind) {
      case "sub": {
        const sub = this.#subs.get(e.id);
        if (!sub || sub._pending || !sub._wanted()) return null;
        const f = sub._frame(this.#history);
        if (this.#bytes(f) > this.#limits.frame) {
          // Told from a microtask: this may run inside subscribe(), before
          // the app could listen to the subscription.
          const err = new FanwireError("too_large", "fanwire: the subscribe is " + this.#bytes(f) + " bytes, over the gateway's " + this.#limits.frame + " (--read-limit)", { id: e.id });
          queueMicrotask(() => sub.closed || sub._failed(err));
          return null;
        }
        sub._pending = true;
        this.#sent(e.id, "sub");
        return [f];
      }
      case "pub": {
        const p = this.#pubs.get(e.id);
        if (!p || p.sent) return null;
        const over = this.#tooLarge(p);
        if (over) {
          this.#pubs.delete(e.id);
          p.done();
          p.reject(new FanwireError("too_large", "fanwire: " + over + ": not sent", { id: e.id }));
          return null;
        }
        p.sent = true;
        return [p.frame];
      }
      case "unsub": {
        const u = this.#unsubs.get(e.id);
        if (!u || u.sent) return null;
        u.sent = true;
        const un = '{"type":"unsubscribe","id":"' + e.id + '"}';
        if (!u.deferred) {
          this.#sent(e.id, "unsub");
          return [un];
        }
        this.#sent(e.id, "sub");
        this.#sent(e.id, "unsub");
        // A durable's consumer outlives its connection: bind it, and
        // unsubscribe, which deletes it.
        return [JSON.stringify({ type: "subscribe", id: e.id, subject: u.pattern, durable: u.durable }), un];
      }
      case "refresh": {
        const r = this.#refreshing;
        return r && r.id === e.id ? [r.frame] : null;
      }
      case "members": {
        const r = this.#members.get(e.id);
        if (!r || r.sent) return null;
        r.sent = true;
        return [r.frame];
      }
      case "pres":
        return this.#presFrame(this.#tracks.get(e.id.slice(PRES_PREFIX.length)));
    }
    return null;
  }

  // ---- presence ---------------------------------------------------------------

  // #presSend sends rec's wish (its newest state, or its untrack) unless
  // one of its messages is on its way (the answer sends the next), it is
  // queued already (what is sent is built when it leaves the queue: the
  // newest), or presence messages are paused after a rate_limited.
  #presSend(rec) {
    if (!this.#ready || rec.inflight !== null || rec.queued) return;
    if (Date.now() < this.#presPausedUntil) {
      this.#presWaiting.add(rec);
      return;
    }
    rec.queued = true;
    this.#enqueue("pres", presKey(rec.subject));
  }

  // #presFrame is what to send for rec when it leaves the queue.
  #presFrame(rec) {
    if (!rec || !rec.queued) return null;
    rec.queued = false;
    if (Date.now() < this.#presPausedUntil) {
      this.#presWaiting.add(rec);
      return null;
    }
    if (rec.want === "untrack") {
      if (!rec.member) {
        this.#presNext(rec);
        return null;
      }
      const id = "u" + this.#nextMsg++;
      rec.inflight = { id, kind: "untrack", ver: rec.ver, json: undefined };
      this.#presIds.set(id, rec);
      return ['{"type":"untrack","id":"' + id + '","subject":' + JSON.stringify(rec.subject) + "}"];
    }
    if (rec.done === rec.ver) return null; // confirmed on this connection already
    const id = "t" + this.#nextMsg++;
    // The first track on a connection takes the membership over (its key,
    // no leave and no join) wherever it still is: on this connection's
    // predecessor, a stopped node (for the grace) or a dead one (until its
    // timeout).
    const resume = !rec.member && rec.secret !== undefined ? ',"resume":' + JSON.stringify(rec.secret) : "";
    const f = '{"type":"track","id":"' + id + '","subject":' + JSON.stringify(rec.subject) + (rec.json === undefined ? "" : ',"state":' + rec.json) + resume + "}";
    const n = this.#bytes(f);
    if (n > this.#limits.frame) {
      // Sent, it would close the connection (1009). Told from a microtask:
      // this may run inside track().
      const err = new FanwireError("too_large", "fanwire: the track is " + n + " bytes, over the gateway's " + this.#limits.frame + " (--read-limit): not sent", { subject: rec.subject });
      const refused = { id, kind: "track", ver: rec.ver, json: rec.json };
      queueMicrotask(() => {
        if (this.#tracks.get(rec.subject) === rec) this.#presResult(rec, refused, err);
      });
      return null;
    }
    rec.inflight = { id, kind: "track", ver: rec.ver, json: rec.json };
    this.#presIds.set(id, rec);
    return [f];
  }

  // #presAnswered handles the answer (tracked, untracked; err: an error)
  // to the track or untrack with id.
  #presAnswered(id, err, m) {
    const rec = this.#presIds.get(id);
    if (!rec) return;
    this.#presIds.delete(id);
    const f = rec.inflight;
    if (f === null || f.id !== id) return;
    rec.inflight = null;
    if (err && err.code === "rate_limited") {
      // Dropped: the newest wish goes once the gateway takes presence
      // messages again (a second), and no other before it: one message
      // per subject then, never one per state given meanwhile.
      this.#presWaiting.add(rec);
      this.#presPause();
      return;
    }
    this.#presResult(rec, f, err, m);
  }

  // #presResult applies the gateway's answer to f, rec's track or untrack
  // (m: the tracked message, with the member's key and resume secret).
  #presResult(rec, f, err, m) {
    if (f.kind === "untrack") {
      if (err) {
        settleRec(rec, f.ver, err);
        if (this.#tracks.get(rec.subject) === rec && rec.want === "untrack") this.#tracks.delete(rec.subject);
        return;
      }
      rec.member = false;
      this.#presNext(rec);
      return;
    }
    if (!err) {
      rec.member = true;
      rec.good = f.json;
      rec.done = Math.max(rec.done, f.ver);
      if (m && typeof m.member === "string") rec.key = m.member;
      if (m && typeof m.resume === "string") rec.secret = m.resume;
      if (rec.want === "track") settleRec(rec, f.ver, null, rec.key);
      this.#presNext(rec);
      return;
    }
    // Refused (forbidden, too_large, too_many_tracks, bad_subject, ...).
    err.subject = rec.subject;
    const told = rec.want === "track" && rec.waiters.some((w) => w.ver <= f.ver);
    if (rec.want === "track") settleRec(rec, f.ver, err);
    if (!told) this.#emitError(err); // a track again after a reconnect: the app asked for none now
    if (this.#tracks.get(rec.subject) !== rec) return;
    if (rec.want === "track" && rec.ver === f.ver) {
      if (!rec.member || rec.good === NO_STATE) {
        // Not a member on this connection: nothing to track again.
        this.#tracks.delete(rec.subject);
        return;
      }
      rec.json = rec.good; // the state the gateway holds
      rec.done = rec.ver;
      return;
    }
    this.#presNext(rec);
  }

  // #presNext goes on with rec after an answer: its newer state, its
  // untrack, or, untracked, its end.
  #presNext(rec) {
    if (this.#tracks.get(rec.subject) !== rec || rec.inflight !== null) return;
    if (rec.want === "track") {
      if (rec.done !== rec.ver) this.#presSend(rec);
      return;
    }
    if (rec.member) {
      this.#presSend(rec);
      return;
    }
    this.#tracks.delete(rec.subject);
    settleRec(rec, rec.ver, null);
  }

  // #presPause holds track and untrack messages for RATE_PAUSE ms, then
  // sends what waits (each record's newest wish).
  #presPause() {
    this.#presPausedUntil = Date.now() + RATE_PAUSE;
    if (this.#presTimer !== null) return;
    const gen = this.#generation;
    const wake = () => {
      this.#presTimer = null;
      if (gen !== this.#generation) return;
      const left = this.#presPausedUntil - Date.now();
      if (left > 0) {
        this.#presTimer = setTimeout(wake, left);
        return;
      }
      const recs = [...this.#presWaiting];
      this.#presWaiting.clear();
      for (const rec of recs) if (this.#tracks.get(rec.subject) === rec) this.#presSend(rec);
    };
    this.#presTimer = setTimeout(wake, RATE_PAUSE);
  }

  #tooLarge(p) {
    const { frame, data } = this.#limits;
    if (p.dataLen * 3 > data) {
      const n = this.#bytes(p.frame) - (p.frame.length - p.dataLen); // the envelope is ASCII
      if (n > data) return "data of " + n + " bytes, over the gateway's " + data + " (--max-publish-bytes)";
    }
    const n = this.#bytes(p.frame);
    return n > frame ? "the publish is " + n + " bytes, over the gateway's " + frame + " (--read-limit)" : "";
  }

  // #bytes is s's length in UTF-8, counted only when it could matter.
  #bytes(s) {
    if (s.length * 3 <= this.#limits.frame && s.length * 3 <= this.#limits.data) return s.length;
    return utf8Length(s);
  }

  #sendNow(frame) {
    try {
      this.#ws.send(frame);
    } catch (e) {
      this.#drop("send failed: " + errText(e), false);
    }
  }

  // _unsubscribe ends sub on the gateway: an unsubscribe, paced, when the
  // gateway may hold it; for a durable it does not hold now, the durable's
  // deletion on this or the next connection.
  _unsubscribe(sub, keep) {
    if (!keep && !this.#subs.delete(sub.id)) return;
    this.#unqueue(sub.id);
    const held = this.#ready && sub._pending;
    if (!held && !(sub.durable !== undefined && sub._bound())) return;
    this.#unsubs.set(sub.id, { pattern: sub.pattern, durable: sub.durable, deferred: !held, sent: false, seq: 0, retry: false, tries: 0 });
    this.#enqueue("unsub", sub.id);
  }

  // _resume sends sub's subscribe again (after a pause).
  _resume(sub) {
    if (this.#unsubs.has(sub.id)) return; // its unsubscribe is not answered yet: on "unsubscribed"
    this.#enqueue("sub", sub.id);
  }

  // ---- tokens -----------------------------------------------------------------

  #refreshing = null; // the refresh being sent: {id, seq, frame}

  // #armRefresh schedules a refresh before the token's exp (when it has one
  // and getToken can give another): 30 s before it, or at 80% of its
  // remaining life when that is shorter, by the gateway's clock (or, from
  // a gateway that does not tell it, by the token's iat), never sooner
  // than MIN_REFRESH_GAP after the last one.
  #armRefresh() {
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
    if (!this.#opts.getToken || !this.#ready) return;
    const c = tokenClaims(this.#token);
    if (!c.exp) return;
    const now = Date.now();
    let left;
    if (this.#skew !== null) left = c.exp - (now + this.#skew);
    else if (c.iat && c.iat < c.exp) left = c.exp - c.iat - (now - this.#tokenAt);
    else left = c.exp - now;
    let delay = Math.max(0, left - Math.min(left * 0.2, 30000));
    if (this.#refreshFails > 0) delay = Math.max(delay, this.#backoff(this.#refreshFails)); // nothing newer last time
    delay = Math.max(delay, this.#lastRefresh + MIN_REFRESH_GAP - now);
    const gen = this.#generation;
    this.#refreshTimer = later(delay, () => gen === this.#generation, (t) => (this.#refreshTimer = t), () => this.#refresh(gen, c.exp));
  }

  async #refresh(gen, oldExp) {
    this.#lastRefresh = Date.now();
    let token;
    try {
      token = await this.#getToken();
    } catch (e) {
      if (gen !== this.#generation) return;
      this.#emitError(new FanwireError("unauthorized", "fanwire: getToken failed: " + errText(e)));
      token = undefined;
    }
    if (gen !== this.#generation) return;
    const exp = tokenClaims(token).exp;
    if (!token || token === this.#token || (exp && exp <= oldExp)) {
      // Nothing newer: ask again later (the connection ends at exp with
      // 4001 if nothing comes, and reconnects with getToken).
      this.#refreshFails++;
      this.#armRefresh();
      return;
    }
    this.#setToken(token);
    const id = "r" + this.#nextMsg++;
    const seq = ++this.#seq;
    this.#refreshing = { id, seq, frame: JSON.stringify({ type: "refresh", id, token }) };
    this.#outbox.push({ kind: "refresh", id, seq });
    this.#flush();
  }
}

/** One subscription of a Client: see Client.subscribe. It is also an async
 * iterable of its events. */
export class Subscription {
  #client;
  #onEvent;
  #from; // the first subscribe's from ("latest" also after a resync to it)
  #resync;
  #cursor;
  #acked = false; // a subscribe of it was confirmed at least once
  #gapReason = "";
  #listeners = { event: new Set(), subscribed: new Set(), gap: new Set(), error: new Set(), leave: new Set(), synced: new Set(), presence: new Set() };
  #readyWaiters = new Set();
  #error = null; // the error that ended it
  #onEnd = null; // a View's: told when the subscription ends
  #signal = null;
  #onAbort = null;
  #retries = 0; // durable_in_use answers in a row
  // the async iterator's buffer, and its waiting next(); a subscription
  // without onEvent buffers from the start
  #buffer = null;
  #iterating = false;
  #bufferMax;
  #waiting = null;
  #paused = false; // unsubscribed on the gateway while the iterator catches up
  _pending = false; // a subscribe was sent on the current connection
  _seq = 0;

  constructor(client, id, pattern, options, onEvent) {
    this.#client = client;
    this.id = id;
    this.pattern = pattern;
    this.#onEvent = onEvent;
    this.#from = options.from === undefined || options.from === null ? undefined : String(options.from);
    this.durable = options.durable === undefined || options.durable === null ? undefined : String(options.durable);
    this.where = options.where === undefined || options.where === null || options.where === "" ? undefined : options.where;
    /** the subscription also gets the presence changes of the subjects it matches (live only) */
    this.presence = options.presence === true;
    this.#resync = options.resync || "live";
    this.#bufferMax = Math.max(2, options.buffer ?? 1000);
    if (!onEvent) this.#buffer = [];
    this.closed = false;
    if (options.signal) {
      this.#signal = options.signal;
      this.#onAbort = () => this.#abort();
      this.#signal.addEventListener("abort", this.#onAbort, { once: true });
    }
  }

  /** The cursor of the last event, leave or synced delivered (durable
   * brokers), or where the subscription started; undefined on Core NATS. */
  get cursor() {
    return this.#cursor;
  }

  /** on registers fn for this subscription's "event" (fn(event)),
   * "subscribed" (fn(subscription)), "gap" (fn(gap)), "error" (fn(err)),
   * "leave" (fn(subject, cursor): the document at subject left a filtered
   * subscription's view) or "synced" (fn(cursor, keys): a subscription
   * with from has caught up and goes live; keys, on a filtered resume,
   * lists every subject in its view) or "presence" (fn(change): a
   * subscription with presence: {subject, count, joins, leaves, updates}
   * of a subject it matches). It returns a function that removes it. */
  on(name, fn) {
    const off = addListener(this.#listeners, name, fn);
    // Events go to listeners: an iterator that nobody started does not
    // hold them back.
    if (name === "event" && !this.#iterating) this.#buffer = null;
    return off;
  }

  /** ready resolves with the subscription once the gateway confirmed it,
   * and rejects with the error that ended it (forbidden, bad_pattern, ...,
   * "closed", "aborted"), or "timeout" after timeout ms when given. */
  ready(timeout) {
    if (this.#acked) return Promise.resolve(this);
    if (this.closed) return Promise.reject(this.#error || new FanwireError("closed", "fanwire: the subscription has ended"));
    return waitFor(this.#readyWaiters, timeout, "subscribed").then(() => this);
  }

  /** unsubscribe stops the subscription: no event is delivered after it. */
  unsubscribe() {
    if (this.closed) return;
    this.#client._unsubscribe(this, false);
    this._end(null);
  }

  [Symbol.asyncIterator]() {
    this.#iterating = true;
    if (this.#buffer === null) this.#buffer = [];
    return {
      next: () => this.#next(),
      return: () => {
        this.unsubscribe();
        this.#buffer = [];
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  #next() {
    const buf = this.#buffer;
    if (buf.length > 0) {
      const value = buf.shift();
      if (this.#paused && buf.length <= this.#bufferMax / 2) this.#unpause();
      return Promise.resolve({ value, done: false });
    }
    if (this.closed) {
      if (this.#error && !normalEnd(this.#error)) return Promise.reject(this.#error);
      return Promise.resolve({ value: undefined, done: true });
    }
    if (this.#paused) this.#unpause();
    return new Promise((resolve, reject) => (this.#waiting = { resolve, reject }));
  }

  // #pause stops the gateway's feed while the iterator's buffer is full;
  // the events after the last one buffered come again on #unpause.
  #pause() {
    this.#paused = true;
    this.#client._unsubscribe(this, true);
  }

  #unpause() {
    this.#paused = false;
    if (!this.#client._history() || this.presence) this.#gapReason = "overflow";
    this.#client._resume(this);
  }

  #abort() {
    if (this.closed) return;
    this.#client._unsubscribe(this, false);
    this._end(new FanwireError("aborted", "fanwire: the subscription's signal was aborted"));
  }

  // _end marks the subscription ended by err (null: unsubscribed).
  _end(err) {
    if (this.closed) return;
    this.closed = true;
    this.#error = err;
    if (this.#signal) this.#signal.removeEventListener("abort", this.#onAbort);
    settle(this.#readyWaiters, err || new FanwireError("closed", "fanwire: unsubscribed before it was confirmed"));
    if (this.#onEnd !== null) this.#onEnd(err);
    const w = this.#waiting;
    if (w && this.#buffer.length === 0) {
      this.#waiting = null;
      if (err && !normalEnd(err)) w.reject(err);
      else w.resolve({ value: undefined, done: true });
    }
  }

  // _watchEnd: fn(err) is told when the subscription ends (err null: unsubscribed).
  _watchEnd(fn) {
    this.#onEnd = fn;
  }

  _wanted() {
    return !this.closed && !this.#paused;
  }

  _bound() {
    return this.#acked || this._pending;
  }

  _disconnected() {
    this._pending = false;
  }

  // _unsubscribed: a pause's unsubscribe was answered; if the iterator
  // caught up meanwhile, the subscription goes on now.
  _unsubscribed() {
    if (!this.closed && !this.#paused) this.#client._resume(this);
  }

  _frame(history) {
    const m = { type: "subscribe", id: this.id, subject: this.pattern };
    if (this.where !== undefined) m.where = this.where; // every time: the gateway keeps no filter across connections
    if (this.presence) {
      // Presence starts live (the gateway refuses it with from): events
      // of the time away are missed, whatever the broker keeps.
      m.presence = true;
      if (this.#acked && this.#gapReason === "") this.#gapReason = "reconnect";
    } else if (!this.#acked) {
      if (this.#from !== undefined) m.from = this.#from;
    } else if (this.#cursor !== undefined) {
      m.from = this.#cursor; // no gap, no duplicate
    } else if (history && this.#gapReason === "") {
      // Confirmed without a cursor and nothing delivered since: the stream
      // was empty, so everything in it now is what came after (and the
      // newest of each subject of it, for a subscription from "latest").
      m.from = this.#from === "latest" ? "latest" : "first";
    } else if (this.#gapReason === "") {
      this.#gapReason = "reconnect"; // Core NATS: live again, told on subscribed
    }
    if (this.durable !== undefined) m.durable = this.durable;
    return JSON.stringify(m);
  }

  _subscribed(cursor) {
    if (this.closed || this.#paused) return;
    if (cursor !== undefined) this.#cursor = cursor;
    this.#acked = true;
    this.#retries = 0;
    if (this.#gapReason !== "") {
      const reason = this.#gapReason;
      this.#gapReason = "";
      this.#gap({ subscription: this, reason, cursor: this.#cursor });
    }
    settle(this.#readyWaiters);
    const c = this.#client;
    for (const fn of this.#listeners.subscribed) c._call(fn, this);
    c._emitSubscribed(this);
  }

  #gap(gap) {
    for (const fn of this.#listeners.gap) this.#client._call(fn, gap);
    this.#client._emitGap(gap);
  }

  _deliver(event) {
    if (this.closed || this.#paused) return;
    const buf = this.#buffer;
    if (buf !== null) {
      if (buf.length >= this.#bufferMax && this.#waiting === null) {
        this.#pause(); // this event and the ones after it come again
        return;
      }
    }
    if (event.cursor !== undefined) this.#cursor = event.cursor;
    if (this.#onEvent !== null) this.#client._call(this.#onEvent, event);
    for (const fn of this.#listeners.event) this.#client._call(fn, event);
    if (buf !== null && !this.closed) {
      const w = this.#waiting;
      if (w !== null) {
        this.#waiting = null;
        w.resolve({ value: event, done: false });
      } else buf.push(event);
    }
  }

  // _leave: the document at subject left this (filtered) subscription's
  // view, at cursor, which the subscription resumes after, as after an event.
  _leave(subject, cursor) {
    if (this.closed || this.#paused) return;
    if (cursor !== undefined) this.#cursor = cursor;
    for (const fn of this.#listeners.leave) this.#client._call(fn, subject, cursor);
  }

  // _presence: change is a presence message for this subscription.
  _presence(change) {
    if (this.closed || this.#paused) return;
    for (const fn of this.#listeners.presence) this.#client._call(fn, change);
  }

  // _synced: a subscribe with from has caught up (the snapshot or replay is
  // delivered) at cursor, and goes live.
  _synced(cursor, keys) {
    if (this.closed || this.#paused) return;
    if (cursor !== undefined) this.#cursor = cursor;
    for (const fn of this.#listeners.synced) this.#client._call(fn, cursor, keys);
  }

  // _failed handles an error answering this subscription's subscribe; it
  // returns the delay (ms) after which to send the subscribe again, or -1.
  _failed(err) {
    this._pending = false;
    err.subscription = this;
    if (err.code === "broker_unavailable") return 500 + Math.random() * 1000;
    if (err.code === "durable_in_use") {
      // Most often our own previous connection, until the gateway's ping
      // times out: try again, and tell the app.
      err.retrying = true;
      this.#error_(err);
      return Math.random() * this.#client._retryDelay(this.#retries++) + 250;
    }
    const expired = err.code === "cursor_expired" || err.code === "bad_cursor";
    if (this.#acked && expired) {
      // The cursor is gone from the broker: tell the app, then go on
      // where it chose.
      const cursor = this.#cursor;
      this.#cursor = undefined;
      this.#acked = false;
      this.#from = this.#resync === "live" ? undefined : this.#resync;
      this.#gap({ subscription: this, reason: err.code, cursor });
      return 0;
    }
    if (!this.#acked && err.code === "cursor_expired" && this.#from !== undefined) {
      // The app's own from expired: the same policy.
      const cursor = this.#from;
      this.#from = this.#resync === "live" ? undefined : this.#resync;
      this.#gap({ subscription: this, reason: err.code, cursor });
      return 0;
    }
    // bad_pattern, forbidden, bad_durable, too_many_subscriptions,
    // too_large, bad_filter, view_too_large, ...: final for this
    // subscription.
    this.#client._unsubscribe(this, false);
    this._end(err);
    this.#error_(err);
    return -1;
  }

  #error_(err) {
    for (const fn of this.#listeners.error) this.#client._call(fn, err);
    this.#client._emitError(err);
  }
}

/** A live view (Client.view): docs holds the newest document of every
 * subject matching the pattern and the filter, kept up to date. The key is
 * the event's subject; the document is the event data's "doc" member when
 * the data is an object that has one (as ingest events do), else the data.
 * An event with op "delete" removes its subject; one with op "truncate" on
 * <prefix>.%truncate removes every <prefix>.<token>; a "leave" (the
 * document no longer passes the filter) removes its subject.
 *
 * It starts from "latest" (the newest event of each subject, then live),
 * and after a reconnect resumes from its cursor with the same filter: the
 * gateway sends the documents that changed meanwhile, then "synced" with
 * the subjects in the view, and the view drops every other one it holds.
 * If the cursor has expired, it starts again from "latest" and, at that
 * snapshot's "synced", drops every document the snapshot did not bring. */
export class View {
  #sub;
  #client;
  #life;
  #seen = new Set(); // subjects upserted since a snapshot from "latest" began; null when none is under way

  constructor(client, pattern, options) {
    this.#client = client;
    this.pattern = pattern;
    /** subject -> document; the app reads it, the view writes it */
    this.docs = new Map();
    const sub = client.subscribe(pattern, { where: options.where, from: "latest", resync: "latest" }, (event) => this.#event(event));
    this.#sub = sub;
    this.where = sub.where;
    this.#life = new Lifecycle(client, sub, "view", noop);
    sub.on("leave", (subject) => this.#remove(subject));
    sub.on("synced", (cursor, keys) => this.#syncedAt(keys));
    sub.on("gap", (gap) => {
      // The cursor expired: the subscription starts again from "latest".
      if (gap.reason === "cursor_expired" || gap.reason === "bad_cursor") this.#seen = new Set();
    });
    this.#life.watchSignal(options.signal);
  }

  /** closed is true once the view has ended. */
  get closed() {
    return this.#life.closed;
  }

  /** The subscription the view reads: the client's "subscribed", "gap"
   * and "error" listeners name it. Close the view, not it. */
  get subscription() {
    return this.#sub;
  }

  /** The cursor the view is up to date at (where it resumes from). */
  get cursor() {
    return this.#sub.cursor;
  }

  /** on registers fn for the view's "change" (fn({type: "upsert" |
   * "remove", key, doc})), "synced" (fn(view): the view is complete, the
   * first time and after each reconnect's catch-up) or "error" (fn(err):
   * the error that ended it, such as bad_filter or view_too_large). It
   * returns a function that removes it. */
  on(name, fn) {
    return addListener(this.#life.listeners, name, fn);
  }

  /** ready resolves with the view at its first "synced" (docs is then
   * complete), and rejects with the error that ended it (bad_filter,
   * view_too_large, forbidden, ...), "closed", "aborted", or "timeout"
   * after timeout ms when given. */
  ready(timeout) {
    return this.#life.ready(this, timeout);
  }

  /** close ends the view: its subscription is unsubscribed; docs keeps
   * what it held. */
  close() {
    this.#life.close(null);
  }

  #event(event) {
    if (this.closed) return;
    const key = event.subject;
    const data = event.data;
    const obj = data !== null && typeof data === "object" && !Array.isArray(data);
    const op = obj && typeof data.op === "string" ? data.op : "";
    if (op === "delete") {
      this.#remove(key);
      return;
    }
    if (op === "truncate" && key.endsWith(".%truncate")) {
      const prefix = key.slice(0, key.length - "%truncate".length); // with its dot
      for (const k of [...this.docs.keys()]) {
        if (k.length > prefix.length && k.startsWith(prefix) && k.indexOf(".", prefix.length) < 0) this.#remove(k);
      }
      return;
    }
    const doc = obj && Object.hasOwn(data, "doc") ? data.doc : data;
    this.docs.set(key, doc);
    if (this.#seen !== null) this.#seen.add(key);
    this.#life.change({ type: "upsert", key, doc });
  }

  #remove(key) {
    if (this.closed || !this.docs.has(key)) return;
    const doc = this.docs.get(key);
    this.docs.delete(key);
    this.#life.change({ type: "remove", key, doc });
  }

  // #syncedAt: the view is complete. Whatever it holds that is not in it
  // (keys, on a filtered resume; what a snapshot from "latest" did not
  // bring) left it while the client was away.
  #syncedAt(keys) {
    if (this.closed) return;
    const keep = keys !== undefined ? new Set(keys) : this.#seen;
    this.#seen = null;
    if (keep !== null) {
      for (const k of [...this.docs.keys()]) if (!keep.has(k)) this.#remove(k);
    }
    if (this.closed) return; // a change listener closed it
    this.#life.synced();
    this.#life.tellSynced(this);
  }
}

/** The members of one subject, kept up to date (Client.presence):
 * members is a Map of conn -> {conn, sub, state}; count is how many.
 *
 * It subscribes to the subject with presence (live), and on every
 * "subscribed" (the first, and after each reconnect: a new connection
 * starts live, so the room starts over) lists every page of members,
 * holding the presence messages that arrive meanwhile, then applies them in
 * order to the list (a join of a member already there is an update), and
 * tells the difference from what it held as one change. From then on each
 * presence message is a change. While disconnected, members keeps what it
 * held. */
export class PresenceRoom {
  #client;
  #sub;
  #life;
  #pageSize;
  #epoch = 0; // counts listings: a late page of an earlier one is ignored
  #held = null; // presence messages held while listing, in order; null when not listing

  constructor(client, subject, options) {
    this.#client = client;
    this.subject = subject;
    /** conn -> member; the app reads it, the room writes it */
    this.members = new Map();
    this.count = 0;
    this.#pageSize = options.pageSize;
    // Events of the subject come too: the app may listen to
    // room.subscription's "event".
    const sub = client.subscribe(subject, { presence: true }, noop);
    this.#sub = sub;
    this.#life = new Lifecycle(client, sub, "room", () => {
      this.#held = null;
    });
    if (options.onChange) this.#life.listeners.change.add(options.onChange);
    sub.on("presence", (change) => this.#onPresence(change));
    sub.on("subscribed", () => {
      this.#list().catch((e) => this.#client._handlerError(e));
    });
    this.#life.watchSignal(options.signal);
  }

  /** closed is true once the room has ended. */
  get closed() {
    return this.#life.closed;
  }

  /** The subscription the room reads (with presence): its "event"
   * listeners get the subject's events. Close the room, not it. */
  get subscription() {
    return this.#sub;
  }

  /** on registers fn for the room's "change" (fn({joins, leaves, updates,
   * count})), "synced" (fn(room): members is complete, after the first
   * listing and after each reconnect's) or "error" (fn(err): the error
   * that ended it). It returns a function that removes it. */
  on(name, fn) {
    return addListener(this.#life.listeners, name, fn);
  }

  /** ready resolves with the room once its first listing is complete,
   * and rejects with the error that ended it (forbidden, bad_subject,
   * ...), "closed", "aborted", or "timeout" after timeout ms. */
  ready(timeout) {
    return this.#life.ready(this, timeout);
  }

  /** close ends the room (its subscription is unsubscribed); members
   * keeps what it held. */
  close() {
    this.#life.close(null);
  }

  // #list lists every member after a "subscribed", then applies what came
  // meanwhile, and tells the difference from what the room held.
  async #list() {
    const epoch = ++this.#epoch;
    this.#held = [];
    const fresh = new Map();
    let after;
    for (;;) {
      let page;
      try {
        page = await this.#client.members(this.subject, after === undefined ? { limit: this.#pageSize } : { after, limit: this.#pageSize });
      } catch (err) {
        if (epoch !== this.#epoch || this.closed) return;
        this.#held = null;
        // The connection ended: the next "subscribed" starts over.
        if (err.code === "disconnected" || err.code === "closed") return;
        this.#life.close(err); // forbidden, bad_subject, ...
        return;
      }
      if (epoch !== this.#epoch || this.closed) return;
      for (const m of page.members) if (m && typeof m.conn === "string") fresh.set(m.conn, m);
      if (!page.next) break;
      after = page.next;
    }
    const held = this.#held;
    this.#held = null;
    for (const change of held) applyPresence(fresh, change);
    const joins = [];
    const leaves = [];
    const updates = [];
    for (const [conn, m] of this.members) {
      if (!fresh.has(conn)) {
        this.members.delete(conn);
        leaves.push(m);
      }
    }
    for (const [conn, m] of fresh) {
      const old = this.members.get(conn);
      if (old === undefined) joins.push(m);
      else if (old.sub !== m.sub || JSON.stringify(old.state) !== JSON.stringify(m.state)) updates.push(m);
      else continue;
      this.members.set(conn, m);
    }
    this.count = this.members.size;
    const first = this.#life.synced();
    if (first || joins.length + leaves.length + updates.length > 0) this.#life.change({ joins, leaves, updates, count: this.count });
    if (this.closed) return;
    this.#life.tellSynced(this);
  }

  #onPresence(change) {
    if (this.closed) return;
    if (this.#held !== null) {
      this.#held.push(change);
      return;
    }
    const c = applyPresence(this.members, change);
    const before = this.count;
    this.count = typeof change.count === "number" ? change.count : this.members.size;
    if (c.joins.length + c.leaves.length + c.updates.length > 0 || this.count !== before) {
      this.#life.change({ joins: c.joins, leaves: c.leaves, updates: c.updates, count: this.count });
    }
  }
}

// Lifecycle is what a View and a PresenceRoom share: their listeners,
// ready's waiters, the abort signal, and how they end. close (the app's,
// the signal's, or an error's) unsubscribes; the subscription's end is the
// end (once): onEnd runs, the waiters are settled, and an error that is
// not a normal end reaches the "error" listeners. what ("view", "room")
// names it in errors.
class Lifecycle {
  listeners = { change: new Set(), synced: new Set(), error: new Set() };
  closed = false;
  #client;
  #sub;
  #what;
  #onEnd;
  #waiters = new Set();
  #synced = false; // a first synced came
  #error = null;
  #signal = null;
  #onAbort = null;

  constructor(client, sub, what, onEnd) {
    this.#client = client;
    this.#sub = sub;
    this.#what = what;
    this.#onEnd = onEnd;
    sub._watchEnd((err) => this.#ended(err));
  }

  // watchSignal closes it when signal (if any) aborts: at once if it has.
  watchSignal(signal) {
    if (!signal) return;
    const abort = () => this.close(new FanwireError("aborted", "fanwire: the " + this.#what + "'s signal was aborted"));
    if (signal.aborted) {
      abort();
      return;
    }
    this.#signal = signal;
    this.#onAbort = abort;
    signal.addEventListener("abort", abort, { once: true });
  }

  ready(owner, timeout) {
    if (this.#synced) return Promise.resolve(owner);
    if (this.closed) return Promise.reject(this.#error || new FanwireError("closed", "fanwire: the " + this.#what + " has ended"));
    return waitFor(this.#waiters, timeout, "synced").then(() => owner);
  }

  close(err) {
    if (this.closed) return;
    this.#error = err;
    this.#sub.unsubscribe(); // #ended
  }

  // synced marks it complete and settles ready's waiters; it reports
  // whether this was the first time.
  synced() {
    const first = !this.#synced;
    this.#synced = true;
    settle(this.#waiters);
    return first;
  }

  // tellSynced calls the "synced" listeners with owner.
  tellSynced(owner) {
    for (const fn of this.listeners.synced) this.#client._call(fn, owner);
  }

  change(change) {
    for (const fn of this.listeners.change) this.#client._call(fn, change);
  }

  #ended(err) {
    if (this.closed) return;
    this.closed = true;
    this.#onEnd();
    if (err !== null) this.#error = err;
    if (this.#signal) this.#signal.removeEventListener("abort", this.#onAbort);
    settle(this.#waiters, this.#error || new FanwireError("closed", "fanwire: the " + this.#what + " was closed before it was synced"));
    const e = this.#error;
    if (e && !normalEnd(e)) for (const fn of this.listeners.error) this.#client._call(fn, e);
  }
}

// applyPresence applies a presence message's changes to members (conn ->
// member) and returns them as they changed members: a join or update of a
// member not there is a join, of one there an update; a leave of one not
// there is nothing (and a leave carries the member as it was).
function applyPresence(members, change) {
  const joins = [];
  const updates = [];
  const leaves = [];
  for (const list of [change.joins, change.updates]) {
    for (const m of list) {
      if (!m || typeof m.conn !== "string") continue;
      (members.has(m.conn) ? updates : joins).push(m);
      members.set(m.conn, m);
    }
  }
  for (const l of change.leaves) {
    const old = l ? members.get(l.conn) : undefined;
    if (old === undefined) continue;
    members.delete(l.conn);
    leaves.push(old);
  }
  return { joins, updates, leaves };
}

// ---- helpers ------------------------------------------------------------------

function noop() {}

// Presence records: the state not confirmed yet (good before any), and
// the outbox key of a subject's record (no other id has a colon).
const NO_STATE = Symbol("no state");
const PRES_PREFIX = "t:";

function presKey(subject) {
  return PRES_PREFIX + subject;
}

// settleRec settles the waiters of rec's wishes up to version ver: resolved,
// or rejected with err.
function settleRec(rec, ver, err, value) {
  const keep = [];
  for (const w of rec.waiters) {
    if (w.ver > ver) keep.push(w);
    else if (err) w.reject(err);
    else w.resolve(value);
  }
  rec.waiters = keep;
}

// normalEnd: an iterator ends without throwing when its subscription was
// unsubscribed, aborted or its client closed.
function normalEnd(err) {
  return err.code === "aborted" || err.code === "closed";
}

function closedError() {
  return new FanwireError("closed", "fanwire: the client is closed");
}

function errText(e) {
  return e && e.message ? e.message : String(e);
}

function addListener(listeners, name, fn) {
  const set = listeners[name];
  if (!set) throw new TypeError("fanwire: unknown event " + JSON.stringify(name) + " (" + Object.keys(listeners).join(", ") + ")");
  if (typeof fn !== "function") throw new TypeError("fanwire: a listener must be a function");
  set.add(fn);
  return () => set.delete(fn);
}

// waitFor adds a waiter to waiters, settled by settle; after timeout ms
// (when given) it rejects with "timeout".
function waitFor(waiters, timeout, what) {
  return new Promise((resolve, reject) => {
    const w = { resolve, reject, timer: null };
    if (timeout > 0) {
      w.timer = setTimeout(() => {
        waiters.delete(w);
        reject(new FanwireError("timeout", "fanwire: not " + what + " within " + timeout + " ms"));
      }, Math.min(timeout, MAX_TIMER));
    }
    waiters.add(w);
  });
}

function settle(waiters, err) {
  for (const w of waiters) {
    clearTimeout(w.timer);
    if (err) w.reject(err);
    else w.resolve();
  }
  waiters.clear();
}

// later runs fn after delay ms, chaining timers past setTimeout's largest
// delay (~24.9 days), while alive() holds; set receives each timer.
function later(delay, alive, set, fn) {
  const step = Math.min(delay, MAX_TIMER);
  const t = setTimeout(() => {
    if (!alive()) return;
    if (delay > MAX_TIMER) later(delay - MAX_TIMER, alive, set, fn);
    else fn();
  }, step);
  set(t);
  return t;
}

// tokenClaims returns a JWT's exp and iat in ms since the epoch (0 when
// absent).
function tokenClaims(token) {
  const none = { exp: 0, iat: 0 };
  if (typeof token !== "string") return none;
  const parts = token.split(".");
  if (parts.length !== 3) return none;
  try {
    const b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = JSON.parse(atob(b64 + "===".slice((b64.length + 3) % 4)));
    const ms = (v) => (typeof v === "number" && isFinite(v) ? v * 1000 : 0);
    return { exp: ms(json.exp), iat: ms(json.iat) };
  } catch {
    return none;
  }
}

function utf8Length(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n++;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}
