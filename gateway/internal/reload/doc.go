// Package reload is the rule files loaded again when they change follow
// (the listener's certificate, the token keys): a check stats them, at
// most once per interval; when they differ from the files as last LOADED,
// they are loaded; a load that fails keeps what is served and is tried
// again at every check until one succeeds. Comparing with the last
// attempt instead would give up on a pair caught half written (the
// certificate before its key) whenever the rest arrives with the same
// size and time stamp (same key type; an mtime kept by rsync -t or a
// coarse file system): the old certificate would stay forever.
//
// It holds what the rule's users share: a file's Stamp, and the Counts of
// loads exported as fanwire_file_reloads_total. Stamps are values; Counts
// are atomics, safe for concurrent use.
package reload
