// Types for fanwire.js, the client of fanwire's native WebSocket protocol.

/** The reconnect backoff: the n-th retry in a row waits a random time in
 * [0, min(max, initial * 2^n)] ms ("full jitter"). The count starts again
 * once a connection has stayed ready for 10 s. */
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

/** What getToken may give: a JWT, or null / undefined to connect without
 * one (an anonymous connection). */
export type TokenResult = string | null | undefined;

export interface ConnectOptions {
  /** A JWT sent with every connection (as ?token=). */
  token?: string;
  /** Called before each connection, on 4001 (expired) and before the
   * token's exp (sent as a refresh); wins over token. A call that has not
   * settled within tokenTimeout counts as failed ("unauthorized"). */
  getToken?: () => TokenResult | Promise<TokenResult>;
  /** ms a getToken call may take; default 10000 */
  tokenTimeout?: number;
  backoff?: Backoff;
  /** Default: globalThis.WebSocket. Node 20: pass the ws package's WebSocket. */
  WebSocket?: WebSocketClass;
  /** ms to wait for the gateway's ready before trying again; default 10000 */
  connectTimeout?: number;
  /** ms between the client's pings; 0: none; default 25000 */
  pingInterval?: number;
  /** ms to wait for anything from the gateway after a ping before the
   * connection is dropped as dead (4000); default 10000 */
  pongTimeout?: number;
  /** messages per second the client sends at most; default: half the
   * gateway's rate limit (its ready message's limits.rate), or 50 when the
   * gateway sends no limits */
  messageRate?: number;
  /** messages the client sends at once before pacing; default: half the
   * gateway's burst (limits.burst), or 100 */
  messageBurst?: number;
  /** publishes waiting for an answer or a connection, at most; default 1000 */
  maxQueued?: number;
  /** ms after which a publish that has no answer rejects with "timeout",
   * unless its own options give another; 0: none; default 0 */
  publishTimeout?: number;
}

export type State = "connecting" | "connected" | "disconnected" | "closed";

export interface StateDetail {
  url?: string;
  /** The close code, when a connection ended: the gateway's (1001 draining,
   * 4001 token expired, 4008 slow consumer, 1008 policy, 4401 / 4403 token
   * refused, ...), the network's (1006), or the client's own: 4000 (the
   * client dropped the connection: it went silent, never became ready, a
   * send failed, or the app called reconnect()) and 1000 (close()). */
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
  /** A filter: a CEL expression over each event (doc, data, subject, op),
   * sent with every subscribe, also after a reconnect. A document that
   * stops passing it comes as a "leave". null, undefined and "": none. */
  where?: string | null;
  /** A cursor, "first" for everything the broker retains, or "latest" for
   * the newest event of each subject, then live (durable brokers). null
   * and undefined: live (as when absent). */
  from?: "first" | "latest" | (string & {}) | null;
  /** A durable consumer's name (JetStream); null and undefined: none. */
  durable?: string | null;
  /** Where to go on when a cursor has expired: "live" (default), "first",
   * or "latest" (the newest event of each subject again). The app is told
   * first, with a "gap" event. */
  resync?: "live" | "first" | "latest";
  /** Aborting it unsubscribes; ready() then rejects with "aborted" if the
   * subscription had not been confirmed yet. */
  signal?: AbortSignal;
  /** Also the presence changes of every subject the pattern matches, to
   * the subscription's "presence" listeners. Presence starts live: it
   * takes no from and no durable, and after a reconnect the subscription
   * starts live again (a "gap" with reason "reconnect"). */
  presence?: boolean;
  /** Events the async iterator holds at most before it pauses the
   * subscription (unsubscribed on the gateway) until the app has read half
   * of them; default 1000. */
  buffer?: number;
}

export interface PublishOptions {
  /** Aborting it before the publish is sent removes it: it rejects with
   * "aborted" and is not published. */
  signal?: AbortSignal;
  /** ms after which the publish rejects with "timeout" (not sent yet: it is
   * removed and not published; sent: it may or may not be published);
   * default: the client's publishTimeout. */
  timeout?: number;
}

/** Why events may have been missed. */
export type GapReason =
  /** Core NATS keeps no history: a reconnect resubscribes live. */
  | "reconnect"
  /** The broker no longer holds the subscription's cursor; it went on as its
   * resync option says. */
  | "cursor_expired"
  | "bad_cursor"
  /** Core NATS: the async iterator's buffer was full, and the subscription
   * was paused until the app caught up. */
  | "overflow";

/** Events may have been missed on subscription. */
export interface Gap<T = unknown> {
  subscription: Subscription<T>;
  reason: GapReason;
  /** the last cursor the subscription had, if any */
  cursor?: string;
}

/** The client's own error codes. */
export type ClientErrorCode =
  /** the client is closed (close(), or a final refusal) */
  | "closed"
  /** the connection ended before a sent publish was answered: it may or may
   * not have been published */
  | "disconnected"
  /** maxQueued publishes are already waiting */
  | "queue_full"
  /** the WebSocket could not be opened */
  | "socket"
  /** getToken failed or timed out, or the gateway refused the token */
  | "unauthorized"
  /** a frame the client could not read, or data that is not JSON */
  | "bad_message"
  /** a message over the gateway's limits (ready.limits), refused locally:
   * nothing was sent and the connection stays */
  | "too_large"
  /** publishTimeout, a publish's timeout, or ready(timeout) passed */
  | "timeout"
  /** the AbortSignal was aborted */
  | "aborted"
  /** an app callback threw, or an async onEvent rejected: err.cause is what
   * it threw */
  | "handler";

/** The gateway's error codes (docs/protocol.md). */
export type GatewayErrorCode =
  | "bad_frame"
  | "unknown_type"
  | "bad_pattern"
  | "duplicate_id"
  | "unknown_id"
  | "too_many_subscriptions"
  | "bad_cursor"
  | "cursor_expired"
  | "bad_durable"
  /** the durable is bound by another live subscription on this node: the
   * client retries (err.retrying) */
  | "durable_in_use"
  | "broker_unavailable"
  | "forbidden"
  | "unauthorized"
  | "revoked"
  | "too_many_durables"
  | "rate_limited"
  | "bad_subject"
  | "too_large"
  /** track: the connection tracks --max-presence-tracks subjects already */
  | "too_many_tracks"
  /** track: the gateway holds --max-presence-members members (every node's) */
  | "too_many_members"
  /** where is not a valid filter; the message names the position */
  | "bad_filter"
  /** a view's snapshot, or the view, passed the gateway's --max-snapshot
   * documents, its connection's or the node's bound on held documents */
  | "view_too_large"
  /** the view's filter took the connection's filters past their cost per
   * event or per second (--max-filter-cost-per-event, --filter-cost-rate):
   * the view has ended; subscribe again, or simplify the where */
  | "filter_too_costly";

export type FanwireErrorCode = ClientErrorCode | GatewayErrorCode;

/** An error the gateway or the client reports. */
export declare class FanwireError extends Error {
  /** extra's fields (id, subscription, closeCode, cause, retrying) are
   * copied onto the error. */
  constructor(code: string, message: string, extra?: object);
  /** The gateway's error code or the client's own (FanwireErrorCode; a newer
   * gateway may send others). */
  readonly code: FanwireErrorCode | (string & {});
  /** the id of the client message it answers */
  readonly id?: string;
  /** the subscription it concerns: a subscribe's refusal (it has ended,
   * unless retrying), a revoked grant, an error of its onEvent */
  readonly subscription?: Subscription<any>;
  /** the close code, for a refused connection (4401, 4403) */
  readonly closeCode?: number;
  /** true when the client tries again by itself (durable_in_use) */
  readonly retrying?: boolean;
  /** what an app callback threw ("handler") */
  readonly cause?: unknown;
  /** the subject of a refused track (also one sent again after a
   * reconnect, told to the client's "error" listeners) */
  readonly subject?: string;
}

/** One subscription of a Client (see Client.subscribe); an async iterable
 * of its events. */
export declare class Subscription<T = unknown> implements AsyncIterable<FanwireEvent<T>> {
  private constructor();
  readonly id: string;
  readonly pattern: string;
  /** the durable consumer's name (options.durable), if any */
  readonly durable: string | undefined;
  /** the filter (options.where), if any */
  readonly where: string | undefined;
  /** options.presence: it also gets presence changes */
  readonly presence: boolean;
  /** The cursor of the last event, leave or synced delivered, or where the
   * subscription started (durable brokers). */
  readonly cursor: string | undefined;
  /** true once unsubscribed, aborted or refused for good */
  readonly closed: boolean;
  /** Resolves with the subscription on its first "subscribed"; rejects with
   * its final error (forbidden, bad_pattern, ...), "closed", "aborted", or
   * "timeout" after timeout ms. */
  ready(timeout?: number): Promise<this>;
  /** Per-subscription listeners; each returns a function that removes it. */
  on(name: "event", fn: (event: FanwireEvent<T>) => void | Promise<void>): () => void;
  on(name: "subscribed", fn: (subscription: this) => void): () => void;
  on(name: "gap", fn: (gap: Gap<T>) => void): () => void;
  on(name: "error", fn: (err: FanwireError) => void): () => void;
  /** The document at subject left the view of a filtered subscription (an
   * update that no longer passes where, or a delete). */
  on(name: "leave", fn: (subject: string, cursor: string | undefined) => void): () => void;
  /** A subscription with from ("latest", "first", a cursor; every resume
   * after a reconnect) has caught up and goes live at cursor (undefined:
   * the stream is empty). keys, on the resume of a filtered subscription,
   * lists every subject in its view now. */
  on(name: "synced", fn: (cursor: string | undefined, keys: string[] | undefined) => void): () => void;
  /** A subscription with presence: the members of subject changed. */
  on(name: "presence", fn: (change: PresenceMessage<any>) => void): () => void;
  /** Ends the subscription: no event is delivered after it. */
  unsubscribe(): void;
  /** The events in order, across reconnects. The iterator holds at most
   * options.buffer events; it ends when the subscription does (by throwing
   * its final error, if any), and breaking out of it unsubscribes. */
  [Symbol.asyncIterator](): AsyncIterableIterator<FanwireEvent<T>>;
}

export interface ViewOptions {
  /** A filter: a CEL expression over each event (doc, data, subject, op).
   * null, undefined and "": none (every subject matching the pattern). */
  where?: string | null;
  /** Aborting it closes the view; ready() then rejects with "aborted" if it
   * was not synced yet. */
  signal?: AbortSignal;
}

/** One change of a view's docs. */
export interface ViewChange<T = unknown> {
  type: "upsert" | "remove";
  /** the document's subject */
  key: string;
  /** the new document (upsert) or the one removed (remove) */
  doc: T;
}

/** A live view (Client.view): docs holds the newest document of every
 * subject matching the pattern and the filter, kept up to date across
 * reconnects (resumed from its cursor; from "latest" again if the cursor
 * expired). */
export declare class View<T = unknown> {
  private constructor();
  readonly pattern: string;
  readonly where: string | undefined;
  /** subject -> document (the event data's doc member when it has one, else
   * the data); complete after each "synced". */
  readonly docs: ReadonlyMap<string, T>;
  /** the cursor the view is up to date at */
  readonly cursor: string | undefined;
  /** the subscription it reads, as the client's subscribed, gap and error
   * listeners name it; close the view, not it */
  readonly subscription: Subscription;
  /** true once closed, aborted or ended by an error */
  readonly closed: boolean;
  /** Resolves with the view at its first "synced"; rejects with the error
   * that ended it (bad_filter, view_too_large, forbidden, ...), "closed",
   * "aborted", or "timeout" after timeout ms. */
  ready(timeout?: number): Promise<this>;
  /** A document entered or changed (upsert) or left (remove); also during
   * the snapshot, before the first "synced". */
  on(name: "change", fn: (change: ViewChange<T>) => void): () => void;
  /** docs is complete: the first time, and after each reconnect's catch-up. */
  on(name: "synced", fn: (view: this) => void): () => void;
  /** The error that ended the view: bad_filter, view_too_large, forbidden, ... */
  on(name: "error", fn: (err: FanwireError) => void): () => void;
  /** Ends the view (its subscription is unsubscribed); docs keeps what it held. */
  close(): void;
}

/** A member of a subject: a connection that tracks it. */
export interface Member<S = unknown> {
  /** the member's connection id (the ready message's connection_id): its key */
  conn: string;
  /** the connection's token's sub; absent for an anonymous connection */
  sub?: string;
  /** the state it tracks (null when it gave none) */
  state: S;
}

/** A member that left: its key and sub. */
export interface MemberLeave {
  conn: string;
  sub?: string;
}

/** A presence message, as a subscription with presence gets it. */
export interface PresenceMessage<S = unknown> {
  subject: string;
  /** the subject's members after the change */
  count: number;
  joins: Member<S>[];
  leaves: MemberLeave[];
  updates: Member<S>[];
}

/** One page of a subject's members (Client.members). */
export interface MembersPage<S = unknown> {
  subject: string;
  /** the subject's members, all pages together */
  count: number;
  /** in key (conn) order */
  members: Member<S>[];
  /** the after of the next page; undefined on the last */
  next?: string;
}

export interface MembersOptions {
  /** the previous page's next */
  after?: string | null;
  /** 1 to 1000; default (the gateway's): 100 */
  limit?: number;
}

/** One change of a room's members. */
export interface PresenceChange<S = unknown> {
  /** members that came (after a reconnect: that the room did not hold) */
  joins: Member<S>[];
  /** members that left, as the room held them */
  leaves: Member<S>[];
  /** members whose state changed */
  updates: Member<S>[];
  /** the members now */
  count: number;
}

export interface PresenceOptions<S = unknown> {
  /** told of every change: the first listing (all joins), each live
   * presence message, and the difference after each reconnect */
  onChange?: (change: PresenceChange<S>) => void;
  /** members per page while listing, 1 to 1000; default 100 */
  pageSize?: number;
  /** Aborting it closes the room. */
  signal?: AbortSignal;
}

/** The members of one subject, kept up to date across reconnects
 * (Client.presence). */
export declare class PresenceRoom<S = unknown> {
  private constructor();
  readonly subject: string;
  /** conn -> member; complete after each "synced" */
  readonly members: ReadonlyMap<string, Member<S>>;
  /** how many members */
  readonly count: number;
  /** the subscription (with presence) it reads; its "event" listeners get
   * the subject's events; close the room, not it */
  readonly subscription: Subscription;
  /** true once closed, aborted or ended by an error */
  readonly closed: boolean;
  /** Resolves with the room once its first listing is complete; rejects
   * with the error that ended it, "closed", "aborted", or "timeout". */
  ready(timeout?: number): Promise<this>;
  on(name: "change", fn: (change: PresenceChange<S>) => void): () => void;
  /** members is complete: the first time, and after each reconnect's listing */
  on(name: "synced", fn: (room: this) => void): () => void;
  /** The error that ended the room: forbidden, bad_subject, ... */
  on(name: "error", fn: (err: FanwireError) => void): () => void;
  /** Ends the room; members keeps what it held. */
  close(): void;
}

/** A connection to fanwire that stays up: see connect. */
export declare class Client {
  constructor(urls: string | string[], options?: ConnectOptions);
  readonly state: State;
  /** the URL in use or being tried */
  readonly url: string;
  on(name: "state", fn: (state: State, detail: StateDetail) => void): () => void;
  on(name: "error", fn: (err: FanwireError) => void): () => void;
  on(name: "gap", fn: (gap: Gap) => void): () => void;
  /** the gateway confirmed a subscribe (again after each reconnect) */
  on(name: "subscribed", fn: (subscription: Subscription) => void): () => void;
  /** Resolves once connected (at once if connected); rejects with
   * "closed" if the client closes first, or "timeout" after timeout ms. */
  ready(timeout?: number): Promise<void>;
  subscribe<T = unknown>(pattern: string, options?: SubscribeOptions, onEvent?: (event: FanwireEvent<T>) => void | Promise<void>): Subscription<T>;
  subscribe<T = unknown>(pattern: string, onEvent: (event: FanwireEvent<T>) => void | Promise<void>): Subscription<T>;
  /** A live view of the newest document of every subject matching pattern
   * (and options.where); durable brokers only. */
  view<T = unknown>(pattern: string, options?: ViewOptions): View<T>;
  /** Resolves with the event's cursor (undefined on Core NATS). */
  publish(subject: string, data: unknown, options?: PublishOptions): Promise<string | undefined>;
  /** Makes the connection a member of subject with state (or updates it),
   * and resumes the membership on every new connection (the same key, no
   * leave and no join); resolves with the member's key (its conn) once the
   * gateway confirmed this state or a newer one. */
  track(subject: string, state?: unknown): Promise<string>;
  /** Ends the membership and forgets it (and its resume secret). */
  untrack(subject: string): Promise<void>;
  /** One page of subject's members. */
  members<S = unknown>(subject: string, options?: MembersOptions): Promise<MembersPage<S>>;
  /** The members of subject, kept up to date. */
  presence<S = unknown>(subject: string, options?: PresenceOptions<S>): PresenceRoom<S>;
  /** Drops the connection, if any, and connects again at once. */
  reconnect(): void;
  close(): Promise<void>;
}

export declare function connect(urls: string | string[], options?: ConnectOptions): Client;
