// Types for fanwire.js, the client of fanwire's native WebSocket protocol.

/** The reconnect backoff: the n-th retry in a row waits a random time in
 * [0, min(max, initial * 2^n)] ms ("full jitter"). */
export interface Backoff {
  /** ms; default 500 */
  initial?: number;
  /** ms; default 30000 */
  max?: number;
}

export declare const DEFAULT_BACKOFF: Readonly<Required<Backoff>>;

/** A WebSocket class: the browser's, Node 22's global one, or the ws
 * package's (anything constructed with a URL that has onmessage, onclose,
 * send and close as the browser's has). */
export type WebSocketClass = new (url: string) => object;

export interface ConnectOptions {
  /** A JWT sent with every connection (as ?token=). */
  token?: string;
  /** Called before each connection, on 4001 (expired) and before the
   * token's exp (sent as a refresh); wins over token. */
  getToken?: () => string | Promise<string>;
  backoff?: Backoff;
  /** Default: globalThis.WebSocket. Node 20: pass the ws package's WebSocket. */
  WebSocket?: WebSocketClass;
  /** ms to wait for the gateway's ready before trying again; default 10000 */
  connectTimeout?: number;
  /** ms between the client's pings; 0: none; default 25000 */
  pingInterval?: number;
  /** ms of silence past pingInterval after which the connection is dropped
   * as dead; default 10000 */
  pongTimeout?: number;
  /** messages per second the client sends at most; keep it under the
   * gateway's --max-message-rate (default 100); default 50 */
  messageRate?: number;
  /** messages the client sends at once before pacing; default 100 */
  messageBurst?: number;
  /** publishes waiting for an answer or a connection, at most; default 1000 */
  maxQueued?: number;
}

export type State = "connecting" | "connected" | "disconnected" | "closed";

export interface StateDetail {
  url?: string;
  /** the close code, when a connection ended */
  code?: number;
  reason?: string;
  /** the gateway's connection id, when connected */
  connectionId?: string;
}

/** One event, as the gateway delivered it. */
export interface FanwireEvent<T = unknown> {
  subject: string;
  data: T;
  /** Present on durable brokers (JetStream, Redis Streams). */
  cursor?: string;
}

export interface SubscribeOptions {
  /** A cursor, or "first" for everything the broker retains (durable brokers). */
  from?: string;
  /** A durable consumer's name (JetStream). */
  durable?: string;
  /** Where to go on when a cursor has expired: "live" (default) or "first".
   * The app is told first, with a "gap" event. */
  resync?: "live" | "first";
}

export interface Subscription {
  readonly id: string;
  readonly pattern: string;
  /** The cursor of the last event delivered, or where the subscription
   * started (durable brokers). */
  readonly cursor: string | undefined;
  /** true once unsubscribed or refused for good */
  readonly closed: boolean;
  unsubscribe(): void;
}

/** Events may have been missed on subscription. */
export interface Gap {
  subscription: Subscription;
  /** "reconnect": Core NATS keeps no history, so a reconnect resubscribes
   * live; "cursor_expired" / "bad_cursor": the broker no longer holds the
   * subscription's cursor, and it went on as its resync option says. */
  reason: "reconnect" | "cursor_expired" | "bad_cursor";
  /** the last cursor the subscription had, if any */
  cursor?: string;
}

export declare class FanwireError extends Error {
  /** The gateway's error code (forbidden, bad_pattern, too_large, ...) or the
   * client's own: closed, disconnected, queue_full, socket, unauthorized,
   * bad_message. */
  readonly code: string;
  /** the id of the client message it answers */
  readonly id?: string;
  /** the subscription it ended, for a subscribe's refusal */
  readonly subscription?: Subscription;
  /** the close code, for a refused connection (4401, 4403) */
  readonly closeCode?: number;
}

export interface Client {
  readonly state: State;
  /** the URL in use or being tried */
  readonly url: string;
  on(name: "state", fn: (state: State, detail: StateDetail) => void): () => void;
  on(name: "error", fn: (err: FanwireError) => void): () => void;
  on(name: "gap", fn: (gap: Gap) => void): () => void;
  /** the gateway confirmed a subscribe (again after each reconnect) */
  on(name: "subscribed", fn: (subscription: Subscription) => void): () => void;
  subscribe<T = unknown>(pattern: string, options: SubscribeOptions, onEvent: (event: FanwireEvent<T>) => void): Subscription;
  subscribe<T = unknown>(pattern: string, onEvent: (event: FanwireEvent<T>) => void): Subscription;
  /** Resolves with the event's cursor (undefined on Core NATS). */
  publish(subject: string, data: unknown): Promise<string | undefined>;
  /** Drops the connection, if any, and connects again at once. */
  reconnect(): void;
  close(): Promise<void>;
}

export declare function connect(urls: string | string[], options?: ConnectOptions): Client;
