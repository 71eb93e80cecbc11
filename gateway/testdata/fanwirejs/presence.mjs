// presence.mjs: the commands of run.mjs that drive fanwire.js's presence
// API (track, untrack, members, the room helper), for fanwire's Go tests
// (gateway/clientjs_presence_test.go). Commands (JSON, one per line on
// stdin); the lines printed carry the command's name as "sub":
//   {"cmd":"track","name","subject","state"?}  -> tracked {sub, conn: the member's key, data.n: ms} | track_error {sub, code, message, subject}
//   {"cmd":"untrack","name","subject"}         -> untracked {sub} | untrack_error {sub, code}
//   {"cmd":"members","name","subject","after"?,"limit"?}
//                                              -> members {sub, count, members, next} | members_error {sub, code}
//   {"cmd":"room","name","subject","pageSize"?}
//        -> room_change {sub, joins, leaves, updates: conns, count, members} per change,
//           room_synced {sub, count, members} per listing; members: [{conn, state}] sorted by conn,
//           state as JSON text
//   {"cmd":"closeRoom","name"}                 -> room_closed {sub}
const rooms = new Map(); // name -> PresenceRoom

const conns = (list) => list.map((m) => m.conn);
const listed = (members) => [...members.values()]
  .map((m) => ({conn: m.conn, state: JSON.stringify(m.state)}))
  .sort((a, b) => (a.conn < b.conn ? -1 : a.conn > b.conn ? 1 : 0));

// handlePresence runs one command c on client, printing with out. It
// returns false for a command it does not know.
export async function handlePresence(client, c, out) {
  const name = c.name;
  switch (c.cmd) {
    case "track": {
      const start = performance.now();
      try {
        const key = await (Object.hasOwn(c, "state") ? client.track(c.subject, c.state) : client.track(c.subject));
        out({k: "tracked", sub: name, subject: c.subject, conn: key, data: {n: Math.round(performance.now() - start)}});
      } catch (e) {
        out({k: "track_error", sub: name, subject: c.subject, code: e.code, message: e.message});
      }
      return true;
    }
    case "untrack":
      try {
        await client.untrack(c.subject);
        out({k: "untracked", sub: name, subject: c.subject});
      } catch (e) {
        out({k: "untrack_error", sub: name, code: e.code, message: e.message});
      }
      return true;
    case "members":
      try {
        const page = await client.members(c.subject, {after: c.after, limit: c.limit});
        out({k: "members", sub: name, count: page.count, members: listed(page.members), next: page.next});
      } catch (e) {
        out({k: "members_error", sub: name, code: e.code, message: e.message});
      }
      return true;
    case "room": {
      const room = client.presence(c.subject, {
        pageSize: c.pageSize,
        onChange: (ch) => out({k: "room_change", sub: name, joins: conns(ch.joins), leaves: conns(ch.leaves), updates: conns(ch.updates), count: ch.count, members: listed(room.members)}),
      });
      rooms.set(name, room);
      room.on("synced", (r) => out({k: "room_synced", sub: name, count: r.count, members: listed(r.members)}));
      room.on("error", (e) => out({k: "room_error", sub: name, code: e.code, message: e.message}));
      return true;
    }
    case "closeRoom":
      rooms.get(name).close();
      out({k: "room_closed", sub: name});
      return true;
    default:
      return false;
  }
}
