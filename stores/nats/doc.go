// Package nats is the NATS JetStream key-value driver of the [spate.Store]
// contract. It needs nats-server 2.11 or newer with JetStream enabled.
//
// The driver takes a ready connection from the caller ([New]) and does not
// own it: Close ends the store's watches and leaves the connection open.
// [Connect] is an optional helper that dials with nats.go and classifies the
// failure (bad credentials and TLS misconfiguration are Fatal, an unreachable
// server is Retryable).
//
// # What production needs
//
//   - nats-server >= 2.11 (limit markers; older servers are refused with a
//     Fatal error that says to upgrade) with JetStream enabled for the account.
//   - Replicas 3 (or 5) and file storage: [Options.Replicas] = 3,
//     [Options.Storage] = jetstream.FileStorage.
//   - `jetstream { sync_interval: always }` in every server's configuration.
//     The default flushes to disk every two minutes; Jepsen's analysis of NATS
//     2.12.1 (December 2025) lost acknowledged writes after coordinated power
//     failures, or one OS crash combined with process pauses or network
//     delays, because of it. A lost acknowledged write is a lost fenced
//     commit, and an epoch that can go backwards.
//
// Replicas 1 is for development: one server is a single point of failure and,
// with the default sync interval, a crash of its host loses recent writes.
// Memory storage loses everything when the servers restart. The driver cannot
// read the servers' sync_interval, so [Store.Capabilities] reports
// LinearizableFailover for R3/R5 file storage and lists `sync_interval:
// always` among the RequiredSettings it depends on. Jepsen also found that
// JetStream did not detect corrupted or truncated data files on a minority of
// nodes and could lose writes when such a node became leader; no setting
// fixes that, so keep disks healthy and NATS current.
//
// # Buckets
//
// One job ([Options.Job]) owns one bucket pair:
//
//	spate_coordination_{job}_state   durable: history 1, no age limit
//	spate_coordination_{job}_lease   ephemeral: history 1, max age = TTL,
//	                                 limit markers kept for one TTL
//
// both with the configured replicas and storage and a per-message cap a little
// above [Options.MaxValueSize] (512 KiB by default: well under the 1 MiB NATS
// payload ceiling). [New] creates the buckets or adopts existing ones. An
// existing bucket whose max age differs from the configuration (a different
// lease TTL) is a Fatal error that says to finish the job or delete the
// buckets: lease duration cannot change mid-job. So are a different replica
// count or storage type, and a lease bucket without limit markers.
//
// The driver provisions the buckets' streams itself, exactly as a KV bucket
// except that direct get is disabled: with direct get every replica answers
// reads and a lagging follower can return a stale value. With it disabled
// every read is answered by the stream leader.
//
// # Revisions and compare-and-swap
//
// Revisions are the bucket's stream sequences: bucket-wide, strictly
// increasing per key across delete and re-create. Create and Update publish
// with an expected last sequence for the key's subject (0 for Create). A
// conflict comes back as "wrong last sequence" (10071) or, on replicated
// streams, as 10164; both mean Lost. Create of a deleted or expired key (whose
// subject holds a delete or limit marker) re-reads the marker and publishes
// at its sequence.
//
// Delete publishes a delete marker, guarded by the expected last sequence when
// a revision is given, and reports the marker's sequence. A guarded delete of
// an absent key loses; an unguarded one wins (and leaves a marker).
//
// # Leases and expiry
//
// JetStream cannot re-arm a per-key TTL, but a bucket's max age applies per
// message: every Create and Update of an ephemeral key is a new message with
// a fresh age, so a key rewritten within the TTL lives on and an untouched one
// ages out. Since 2.11 the server then leaves a limit marker, which watchers
// receive; the driver reports it as a [spate.WatchDelete] at the marker's
// sequence. Marker precision is one second, so the TTL floor is 2 s
// ([TTLFloor]). Expiry is applied by the server: until it has removed the
// message (up to [Capabilities.ExpiryLatency] after the deadline) an expired
// key still reads as live and a Create of it loses.
//
// # Watches
//
// A watch is an ordered consumer delivering the last message per key and then
// every later one. The driver folds messages into a snapshot until it has
// caught up (nothing was pending when the consumer was made, or a message
// reports nothing pending or reaches the stream's last sequence, or — when
// messages vanished before delivery — the consumer reports nothing pending
// and nothing undelivered), then emits the snapshot's puts, one
// [spate.WatchSnapshotDone] and the live stream. An empty bucket gets its
// SnapshotDone at once. Delete and limit markers become deletes. Prefixes
// that end in the middle of a key segment ("spl") are matched exactly: the
// subject filter covers the enclosing segment and the driver filters by
// string prefix.
//
// History is 1, so a watcher that falls behind a fast writer skips revisions
// of a key that were superseded before delivery, and always gets the latest.
// A consumer that breaks and cannot be re-created, or a closed connection,
// ends the watch with a Retryable [spate.WatchError].
//
// # Listing
//
// List reads the authoritative key set (an ordered consumer over headers only,
// markers excluded) and then gets each key: 1 + N round trips, N of them
// concurrent. It never under-reports: a key live for the whole call is in the
// key set and its get finds it.
//
// # Errors
//
// Timeouts, disconnection, no responders and cancelled contexts are
// Retryable; a Retryable write may have landed. Bad credentials, missing
// permissions, JetStream disabled, an old server, a bucket with the wrong
// settings, a deleted bucket and a connection closed by its owner are Fatal.
package nats
