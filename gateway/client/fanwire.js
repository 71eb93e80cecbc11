// fanwire.js: the client for fanwire's native WebSocket protocol, for
// browsers and Node. One ES module, no dependencies. Every fanwire node
// serves it at /fanwire.js (and its types at /fanwire.d.ts):
//
//	import {connect} from "https://gateway.example.com/fanwire.js";
//	const client = connect("wss://gateway.example.com/ws", {getToken});
//	client.subscribe("orders.*", {}, (event) => console.log(event.subject, event.data));
//
// The client reconnects by itself (exponential backoff with full jitter,
// at once after a node's 1001 drain), subscribes again after every
// reconnect from each subscription's last cursor on durable brokers (no gap,
// no duplicate), tells the app with a "gap" event where events may have been
// missed (Core NATS, an expired cursor), paces what it sends under the
// gateway's message rate, and refreshes tokens before they expire. It holds
// nothing without a bound: its own state is one record per subscription and
// per publish not yet answered (at most maxQueued), and a frame is handled
// whole as it arrives. The protocol, the reconnect policy and the guarantees
// per broker are in the repository's docs/client.md and docs/protocol.md.

/** The default reconnect backoff: the n-th retry in a row waits a random
 * time in [0, min(max, initial * 2^n)] ms ("full jitter"). */
export const DEFAULT_BACKOFF = Object.freeze({ initial: 500, max: 30000 });

// Close codes the gateway sends (docs/protocol.md).
const CLOSE_NORMAL = 1000;
const CLOSE_GOING_AWAY = 1001; // node draining: reconnect at once, elsewhere
const CLOSE_TOKEN_EXPIRED = 4001; // token expired without a refresh: new token, reconnect
const CLOSE_SLOW_CONSUMER = 4008; // the client fell behind: reconnect with backoff, resume
const CLOSE_UNAUTHORIZED = 4401; // the token was refused: final unless getToken gives another
const CLOSE_FORBIDDEN = 4403; // refused: final
const CLOSE_NO_PONG = 4000; // ours: the connection went silent, dropped it

// Errors on a subscribe that the client answers by itself.
const RETRY_LATER = new Set(["rate_limited", "broker_unavailable"]);

/** An error the gateway or the client reports. code is the protocol's error
 * code (docs/protocol.md) or one of the client's own: "closed",
 * "disconnected", "queue_full", "socket", "unauthorized", "bad_message". */
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
  #ready = false; // the current socket got "ready"
  #state = "connecting";
  #urlIndex = 0;
  #attempt = 0; // connection attempts in a row that did not reach ready
  #retryTimer = null;
  #connectTimer = null;
  #pingTimer = null;
  #refreshTimer = null;
  #sendTimer = null;
  #lastHeard = 0;
  #token;
  #tokenRefused = false; // the last connection was refused for its token
  #history = false; // the node's broker keeps history (cursors)
  #listeners = { state: new Set(), error: new Set(), gap: new Set(), subscribed: new Set() };
  #subs = new Map(); // id -> Subscription, in subscribe order
  #nextSub = 1;
  #pubs = new Map(); // id -> pending publish, in publish order
  #nextMsg = 1;
  #outbox = []; // ids of subscriptions and publishes waiting to be sent, in order
  #tokens = 0; // the send pacer's bucket
  #tokensAt = 0;
  #pausedUntil = 0;
  #generation = 0; // counts sockets, so late callbacks of an old one are ignored

  constructor(urls, options) {
    this.#urls = (Array.isArray(urls) ? urls : [urls]).map(String);
    if (this.#urls.length === 0) throw new TypeError("fanwire: connect needs at least one URL");
    const o = options || {};
    const backoff = { ...DEFAULT_BACKOFF, ...(o.backoff || {}) };
    this.#opts = {
      backoff,
      getToken: o.getToken,
      connectTimeout: o.connectTimeout ?? 10000,
      pingInterval: o.pingInterval ?? 25000,
      pongTimeout: o.pongTimeout ?? 10000,
      messageRate: o.messageRate ?? 50,
      messageBurst: o.messageBurst ?? 100,
      maxQueued: o.maxQueued ?? 1000,
    };
    this.#token = o.token;
    this.#WS = o.WebSocket || globalThis.WebSocket;
    if (typeof this.#WS !== "function") {
      throw new TypeError("fanwire: no WebSocket here: pass one as options.WebSocket (Node 20: the ws package)");
    }
    this.#tokens = this.#opts.messageBurst;
    this.#tokensAt = Date.now();
    this.#open();
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
   * "gap" (fn(gap)) or "subscribed" (fn(subscription): the gateway confirmed
   * a subscribe, after which every matching event reaches it; again after
   * each reconnect). It returns a function that removes it.
   */
  on(name, fn) {
    const set = this.#listeners[name];
    if (!set) throw new TypeError("fanwire: unknown event " + JSON.stringify(name) + " (state, error, gap, subscribed)");
    set.add(fn);
    return () => set.delete(fn);
  }

  /**
   * subscribe delivers every event matching pattern to onEvent, once, in
   * order, across reconnects. options.from: a cursor or "first" (durable
   * brokers); options.durable: a durable consumer's name (JetStream);
   * options.resync: where to go on when a cursor has expired, "live"
   * (default) or "first".
   */
  subscribe(pattern, options, onEvent) {
    if (typeof options === "function") [options, onEvent] = [{}, options];
    if (typeof onEvent !== "function") throw new TypeError("fanwire: subscribe needs an onEvent function");
    if (this.#state === "closed") throw new FanwireError("closed", "fanwire: the client is closed");
    const o = options || {};
    if (o.resync !== undefined && o.resync !== "live" && o.resync !== "first") {
      throw new TypeError('fanwire: resync is "live" or "first"');
    }
    const sub = new Subscription(this, "s" + this.#nextSub++, String(pattern), o, onEvent);
    this.#subs.set(sub.id, sub);
    this.#enqueue(sub.id);
    return sub;
  }

  /**
   * publish sends data (any JSON value) to subject over the connection,
   * which needs a token with a publish grant (or a gateway that lets
   * anonymous connections publish). It resolves with the event's cursor on
   * durable brokers (undefined on Core NATS) once the broker has it, and
   * rejects with a FanwireError: the gateway's code (forbidden,
   * bad_subject, too_large, broker_unavailable, ...), "disconnected" when
   * the connection ended before the answer (the event may or may not have
   * been published), "queue_full" or "closed". While disconnected, it waits
   * for the next connection (at most maxQueued publishes wait).
   */
  publish(subject, data) {
    if (this.#state === "closed") return Promise.reject(new FanwireError("closed", "fanwire: the client is closed"));
    if (this.#pubs.size >= this.#opts.maxQueued) {
      return Promise.reject(new FanwireError("queue_full", "fanwire: " + this.#opts.maxQueued + " publishes are already waiting (maxQueued)"));
    }
    let frame;
    const id = "p" + this.#nextMsg++;
    try {
      frame = JSON.stringify({ type: "publish", id, subject: String(subject), data });
    } catch (e) {
      return Promise.reject(new FanwireError("bad_message", "fanwire: data is not JSON: " + e.message));
    }
    if (frame === undefined || data === undefined) {
      return Promise.reject(new FanwireError("bad_message", "fanwire: data must be a JSON value"));
    }
    return new Promise((resolve, reject) => {
      this.#pubs.set(id, { frame, resolve, reject, sent: false });
      this.#enqueue(id);
    });
  }

  /** close ends the client: no reconnect, pending publishes reject with
   * "closed". It resolves once the socket is closed. */
  close() {
    if (this.#state === "closed") return Promise.resolve();
    const ws = this.#ws;
    this.#clearTimers();
    this.#ws = null;
    this.#ready = false;
    this.#generation++;
    this.#outbox = [];
    this.#finish({ code: CLOSE_NORMAL, reason: "closed by the client" });
    if (!ws || ws.readyState === 3) return Promise.resolve();
    return new Promise((resolve) => {
      const t = setTimeout(resolve, 2000);
      ws.onclose = () => {
        clearTimeout(t);
        resolve();
      };
      ws.onmessage = ws.onerror = null;
      try {
        ws.close(CLOSE_NORMAL, "client closed");
      } catch {
        clearTimeout(t);
        resolve();
      }
    });
  }

  // ---- connecting -----------------------------------------------------------

  async #open() {
    const gen = ++this.#generation;
    this.#setState("connecting", { url: this.url });
    let token = this.#token;
    if (this.#opts.getToken) {
      try {
        token = await this.#opts.getToken();
      } catch (e) {
        if (gen !== this.#generation) return;
        this.#emitError(new FanwireError("unauthorized", "fanwire: getToken failed: " + (e && e.message ? e.message : String(e))));
        this.#retry(false);
        return;
      }
      if (gen !== this.#generation) return; // closed meanwhile
      this.#token = token;
    }
    let url = this.url;
    if (token) url += (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
    let ws;
    try {
      ws = new this.#WS(url);
    } catch (e) {
      this.#emitError(new FanwireError("socket", "fanwire: cannot open " + this.url + ": " + (e && e.message ? e.message : String(e))));
      this.#retry(false);
      return;
    }
    this.#ws = ws;
    this.#ready = false;
    this.#lastHeard = Date.now();
    ws.onmessage = (ev) => {
      if (gen === this.#generation) this.#onFrame(ev.data);
    };
    ws.onerror = () => {}; // the close event follows and says what happened
    ws.onclose = (ev) => {
      if (gen === this.#generation) this.#onClose(ev.code, ev.reason || "");
    };
    this.#connectTimer = setTimeout(() => {
      if (gen === this.#generation && !this.#ready) this.#drop(CLOSE_NO_PONG, "no ready within " + this.#opts.connectTimeout + " ms");
    }, this.#opts.connectTimeout);
  }

  // #drop abandons the current socket without waiting for its close
  // handshake (it may be dead) and goes on as if it had closed with code.
  #drop(code, reason) {
    const ws = this.#ws;
    if (ws) {
      ws.onmessage = ws.onclose = null;
      try {
        ws.close(CLOSE_NO_PONG, reason.slice(0, 120));
      } catch {
        // closing a socket that never opened throws in some implementations
      }
    }
    this.#onClose(code, reason);
  }

  #onClose(code, reason) {
    const wasReady = this.#ready;
    this.#ws = null;
    this.#ready = false;
    this.#generation++;
    this.#clearTimers();
    // A publish sent and not answered may or may not be in the broker: the
    // app decides. One not sent yet waits for the next connection.
    for (const [id, p] of this.#pubs) {
      if (!p.sent) continue;
      this.#pubs.delete(id);
      p.reject(new FanwireError("disconnected", "fanwire: the connection closed (" + code + ") before the publish was answered: it may or may not have been published", { id }));
    }
    this.#outbox = [];
    for (const sub of this.#subs.values()) sub._pending = false;
    const detail = { code, reason, url: this.url };
    if (code === CLOSE_UNAUTHORIZED || code === CLOSE_FORBIDDEN) {
      // A refused token is final, unless getToken may give a better one
      // and the token that failed was not already a fresh one.
      const final = !this.#opts.getToken || this.#tokenRefused;
      this.#tokenRefused = true;
      const err = new FanwireError(code === CLOSE_FORBIDDEN ? "forbidden" : "unauthorized", "fanwire: the gateway refused the connection: " + (reason || code), { closeCode: code });
      this.#emitError(err);
      if (final) {
        this.#finish(detail);
        return;
      }
      this.#setState("disconnected", detail);
      this.#schedule(0);
      return;
    }
    this.#tokenRefused = false;
    this.#setState("disconnected", detail);
    if (code === CLOSE_GOING_AWAY || code === CLOSE_TOKEN_EXPIRED) {
      // A draining node: at once, to the next node. An expired token:
      // at once, with a new token from getToken.
      this.#attempt = 0;
      if (code === CLOSE_GOING_AWAY) this.#nextURL();
      this.#schedule(0);
      return;
    }
    if (code === CLOSE_SLOW_CONSUMER) this.#attempt = Math.max(this.#attempt, 1);
    this.#retry(wasReady);
  }

  // #finish ends the client (close, or a final refusal): no retry, and the
  // publishes still waiting reject with "closed".
  #finish(detail) {
    clearTimeout(this.#retryTimer);
    for (const [id, p] of this.#pubs) {
      this.#pubs.delete(id);
      p.reject(new FanwireError("closed", "fanwire: the client stopped: " + (detail.reason || detail.code)));
    }
    this.#setState("closed", detail);
  }

  #retry(wasReady) {
    if (!wasReady) this.#nextURL();
    const b = this.#opts.backoff;
    const cap = Math.min(b.max, b.initial * 2 ** Math.min(this.#attempt, 30));
    this.#attempt++;
    this.#schedule(Math.random() * cap);
  }

  #nextURL() {
    this.#urlIndex = (this.#urlIndex + 1) % this.#urls.length;
  }

  #schedule(delay) {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = null;
      if (this.#state !== "closed") this.#open();
    }, delay);
  }

  #clearTimers() {
    clearTimeout(this.#connectTimer);
    clearInterval(this.#pingTimer);
    clearTimeout(this.#refreshTimer);
    clearTimeout(this.#sendTimer);
    this.#connectTimer = this.#pingTimer = this.#refreshTimer = this.#sendTimer = null;
  }

  #setState(state, detail) {
    if (this.#state === state && state !== "disconnected") return;
    this.#state = state;
    for (const fn of this.#listeners.state) call(fn, state, detail);
  }

  #emitError(err) {
    if (this.#listeners.error.size === 0 && typeof console !== "undefined") console.warn(err.message);
    for (const fn of this.#listeners.error) call(fn, err);
  }

  _emitError(err) {
    this.#emitError(err);
  }

  _emitGap(gap) {
    for (const fn of this.#listeners.gap) call(fn, gap);
  }

  _emitSubscribed(sub) {
    for (const fn of this.#listeners.subscribed) call(fn, sub);
  }

  /** reconnect drops the current connection, if any, and connects again at
   * once (a "retry now" for an app that knows the network is back). */
  reconnect() {
    if (this.#state === "closed") return;
    this.#attempt = 0;
    if (this.#ws) this.#drop(CLOSE_NORMAL, "reconnect asked by the app");
    this.#schedule(0);
  }

  // ---- receiving ------------------------------------------------------------

  #onFrame(data) {
    this.#lastHeard = Date.now();
    if (typeof data !== "string") {
      this.#emitError(new FanwireError("bad_message", "fanwire: the gateway sent a binary frame"));
      return;
    }
    // The gateway may put several messages in one frame, one per line.
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
        if (this.#ws === null) return; // the message ended the connection
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
      case "ready":
        this.#onReady(m);
        return;
      case "subscribed": {
        const sub = this.#subs.get(m.id);
        if (sub) sub._subscribed(m.cursor);
        return;
      }
      case "published": {
        const p = this.#pubs.get(m.id);
        if (p) {
          this.#pubs.delete(m.id);
          p.resolve(m.cursor);
        }
        return;
      }
      case "refreshed":
        this.#armRefresh();
        return;
      case "error":
        this.#onError(m);
        return;
      default: // pong, unsubscribed: nothing to do
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

  #onReady(m) {
    clearTimeout(this.#connectTimer);
    this.#connectTimer = null;
    this.#ready = true;
    this.#attempt = 0;
    this.#tokenRefused = false;
    this.#history = m.history === true;
    this.#setState("connected", { url: this.url, connectionId: m.connection_id });
    const gen = this.#generation;
    const { pingInterval, pongTimeout } = this.#opts;
    if (pingInterval > 0) {
      this.#pingTimer = setInterval(() => {
        if (gen !== this.#generation) return;
        if (Date.now() - this.#lastHeard > pingInterval + pongTimeout) {
          this.#drop(CLOSE_NO_PONG, "nothing heard for " + (pingInterval + pongTimeout) + " ms");
          return;
        }
        this.#sendNow('{"type":"ping"}');
      }, pingInterval);
    }
    this.#armRefresh();
    // Everything again, in the order the app asked for it: subscriptions
    // (from their cursors), then the publishes that waited.
    this.#outbox = [];
    for (const sub of this.#subs.values()) this.#outbox.push(sub.id);
    for (const [id, p] of this.#pubs) if (!p.sent) this.#outbox.push(id);
    this.#flush();
  }

  #onError(m) {
    const id = m.id;
    const err = new FanwireError(m.code || "error", m.message || m.code || "error", id === undefined ? undefined : { id });
    const sub = id !== undefined ? this.#subs.get(id) : undefined;
    if (sub) {
      if (sub._failed(err)) this.#enqueueAfter(id, err.code);
      return;
    }
    const p = id !== undefined ? this.#pubs.get(id) : undefined;
    if (p) {
      if (err.code === "rate_limited") {
        p.sent = false; // dropped unpublished: send it again
        this.#enqueueAfter(id, err.code);
        return;
      }
      this.#pubs.delete(id);
      p.reject(err);
      return;
    }
    // An answer for a subscription the app has already ended, or an
    // unsubscribe that crossed its subscribe's refusal: nothing to tell.
    if (err.code === "unknown_id" || (typeof id === "string" && /^[sp][0-9]+$/.test(id))) return;
    this.#emitError(err);
  }

  // ---- sending --------------------------------------------------------------

  // #enqueue queues a subscription's subscribe or a publish for sending.
  #enqueue(id) {
    if (!this.#ready) return; // sent on "ready"
    this.#outbox.push(id);
    this.#flush();
  }

  // #enqueueAfter queues id again after the gateway dropped it: rate_limited
  // pauses sending for a second (the bucket refills), broker_unavailable
  // retries the subscription after a backoff.
  #enqueueAfter(id, code) {
    if (code === "rate_limited") {
      this.#pausedUntil = Date.now() + 1000;
      this.#tokens = 0;
      this.#outbox.unshift(id);
      this.#flush();
      return;
    }
    const gen = this.#generation;
    setTimeout(() => {
      if (gen === this.#generation) this.#enqueue(id);
    }, 500 + Math.random() * 1000);
  }

  // #flush sends what the outbox holds, paced: at most messageBurst at once,
  // then messageRate per second, under the gateway's --max-message-rate
  // (default 100 per second, burst 200) with room left for pings.
  #flush() {
    clearTimeout(this.#sendTimer);
    this.#sendTimer = null;
    if (!this.#ready) return;
    const { messageRate, messageBurst } = this.#opts;
    while (this.#outbox.length > 0) {
      const now = Date.now();
      if (now < this.#pausedUntil) {
        this.#sendTimer = setTimeout(() => this.#flush(), this.#pausedUntil - now);
        return;
      }
      if (messageRate > 0) {
        this.#tokens = Math.min(messageBurst, this.#tokens + ((now - this.#tokensAt) * messageRate) / 1000);
        this.#tokensAt = now;
        if (this.#tokens < 1) {
          this.#sendTimer = setTimeout(() => this.#flush(), Math.ceil(((1 - this.#tokens) * 1000) / messageRate));
          return;
        }
        this.#tokens--;
      }
      const id = this.#outbox.shift();
      const sub = this.#subs.get(id);
      if (sub) {
        if (!sub._pending) {
          sub._pending = true;
          this.#sendNow(sub._frame(this.#history));
        }
        continue;
      }
      const p = this.#pubs.get(id);
      if (p && !p.sent) {
        p.sent = true;
        this.#sendNow(p.frame);
      }
    }
  }

  #sendNow(frame) {
    try {
      this.#ws.send(frame);
    } catch (e) {
      this.#drop(1006, "send failed: " + (e && e.message ? e.message : String(e)));
    }
  }

  _unsubscribe(sub) {
    if (!this.#subs.delete(sub.id)) return;
    const i = this.#outbox.indexOf(sub.id);
    if (i >= 0) this.#outbox.splice(i, 1);
    // Sent only when the gateway may hold the subscription. Unpaced: one
    // message per unsubscribe, and the gateway answers an unknown id with
    // an error the client ignores.
    if (this.#ready && sub._pending) this.#sendNow(JSON.stringify({ type: "unsubscribe", id: sub.id }));
  }

  // ---- tokens -----------------------------------------------------------------

  // #armRefresh schedules a refresh before the token's exp (when it has one
  // and getToken can give another): 30 s before it, or at 80% of its
  // remaining life when that is shorter.
  #armRefresh() {
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
    if (!this.#opts.getToken || !this.#ready) return;
    const exp = tokenExpiry(this.#token);
    if (!exp) return;
    const left = exp - Date.now();
    const delay = Math.max(0, left - Math.min(left * 0.2, 30000));
    const gen = this.#generation;
    this.#refreshTimer = setTimeout(async () => {
      if (gen !== this.#generation) return;
      let token;
      try {
        token = await this.#opts.getToken();
      } catch (e) {
        this.#emitError(new FanwireError("unauthorized", "fanwire: getToken failed: " + (e && e.message ? e.message : String(e))));
        return; // the connection closes with 4001 at expiry, and reconnects
      }
      if (gen !== this.#generation || !token) return;
      this.#token = token;
      this.#sendNow(JSON.stringify({ type: "refresh", id: "r" + this.#nextMsg++, token }));
    }, delay);
  }
}

/** One subscription of a Client: see Client.subscribe. */
export class Subscription {
  #client;
  #onEvent;
  #from; // the first subscribe's from
  #durable;
  #resync;
  #cursor;
  #acked = false; // a subscribe of it was confirmed at least once
  #gapReason = "";
  _pending = false; // a subscribe was sent on the current connection

  constructor(client, id, pattern, options, onEvent) {
    this.#client = client;
    this.id = id;
    this.pattern = pattern;
    this.#onEvent = onEvent;
    this.#from = options.from === undefined ? undefined : String(options.from);
    this.#durable = options.durable === undefined ? undefined : String(options.durable);
    this.#resync = options.resync || "live";
    this.closed = false;
  }

  /** The cursor of the last event delivered (durable brokers), or where
   * the subscription started; undefined on Core NATS. */
  get cursor() {
    return this.#cursor;
  }

  /** unsubscribe stops the subscription: onEvent is not called again. */
  unsubscribe() {
    if (this.closed) return;
    this.closed = true;
    this.#client._unsubscribe(this);
  }

  _frame(history) {
    const m = { type: "subscribe", id: this.id, subject: this.pattern };
    if (!this.#acked) {
      if (this.#from !== undefined) m.from = this.#from;
    } else if (this.#cursor !== undefined) {
      m.from = this.#cursor; // no gap, no duplicate
    } else if (history && this.#gapReason === "") {
      // Confirmed without a cursor and nothing delivered since: the stream
      // was empty, so everything in it now is what came after.
      m.from = "first";
    } else if (this.#gapReason === "") {
      this.#gapReason = "reconnect"; // Core NATS: live again, told on subscribed
    }
    if (this.#durable !== undefined) m.durable = this.#durable;
    return JSON.stringify(m);
  }

  _subscribed(cursor) {
    if (cursor !== undefined) this.#cursor = cursor;
    this.#acked = true;
    if (this.#gapReason !== "") {
      const reason = this.#gapReason;
      this.#gapReason = "";
      this.#client._emitGap({ subscription: this, reason, cursor: this.#cursor });
    }
    this.#client._emitSubscribed(this);
  }

  _deliver(event) {
    if (this.closed) return;
    if (event.cursor !== undefined) this.#cursor = event.cursor;
    try {
      this.#onEvent(event);
    } catch (e) {
      reportLater(e);
    }
  }

  // _failed handles an error answering this subscription's subscribe; it
  // returns whether to send the subscribe again (the client schedules it).
  _failed(err) {
    this._pending = false;
    if (RETRY_LATER.has(err.code)) return true;
    if (this.#acked && (err.code === "cursor_expired" || err.code === "bad_cursor")) {
      // The cursor is gone from the broker: tell the app, then go on
      // where it chose.
      const cursor = this.#cursor;
      this.#cursor = undefined;
      this.#acked = false;
      this.#from = this.#resync === "first" ? "first" : undefined;
      this.#client._emitGap({ subscription: this, reason: err.code, cursor });
      return true;
    }
    if (!this.#acked && err.code === "cursor_expired" && this.#from !== undefined) {
      // The app's own from expired: the same policy.
      const cursor = this.#from;
      this.#from = this.#resync === "first" ? "first" : undefined;
      this.#client._emitGap({ subscription: this, reason: err.code, cursor });
      return true;
    }
    // bad_pattern, forbidden, bad_durable, too_many_subscriptions, ...:
    // final for this subscription.
    this.closed = true;
    this.#client._unsubscribe(this);
    err.subscription = this;
    this.#client._emitError(err);
    return false;
  }
}

// tokenExpiry returns a JWT's exp in ms since the epoch, or 0.
function tokenExpiry(token) {
  if (typeof token !== "string") return 0;
  const parts = token.split(".");
  if (parts.length !== 3) return 0;
  try {
    const b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = JSON.parse(atob(b64 + "===".slice((b64.length + 3) % 4)));
    return typeof json.exp === "number" ? json.exp * 1000 : 0;
  } catch {
    return 0;
  }
}

// call runs an app callback; what it throws is reported, not let through
// into the client's own state changes.
function call(fn, ...args) {
  try {
    fn(...args);
  } catch (e) {
    reportLater(e);
  }
}

function reportLater(e) {
  setTimeout(() => {
    throw e;
  });
}
