// Package nats is the NATS JetStream key-value driver of the [spate.Store]
// contract. It needs nats-server 2.11 or newer with JetStream enabled.
//
// The driver takes a ready connection from the caller ([New]) and does not
// own it: Close ends the store's watches and leaves the connection open.
// [Connect] is an optional helper that dials with nats.go and classifies the
// failure (bad credentials and TLS misconfiguration are Fatal, an unreachable
// server is Retryable).
//
// For tests, stores/nats/natstest runs a nats-server inside the test
// process and gives the conformance suite a harness over it.
//
// # What production needs
//
//   - nats-server >= 2.11 (limit markers; older servers are refused with a
//     Fatal error that says to upgrade) with JetStream enabled for the account.
//   - Replicas 3 (or 5) and file storage: [Options.Replicas] = 3,
//     [Options.Storage] = jetstream.FileStorage (the zero value).
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
// nodes and could lose writes when such a node became leader, and saw
// persistent split-brain after an OS crash combined with delays; no setting
// fixes those, so keep disks healthy and NATS current. The driver's own
// failover test (a 3-node R3 cluster with sync_interval always, the stream
// leader stopped and restarted under concurrent compare-and-swap) checks the
// history with porcupine; it stops servers cleanly and cannot model power
// loss.
//
// # Buckets
//
// One job ([Options.Job]) owns one bucket pair ([Buckets]):
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
// count or storage type, direct get, and a lease bucket without limit
// markers.
//
// The driver provisions the buckets' streams itself, exactly as a KV bucket
// except that direct get is off: with direct get every replica answers reads
// and a lagging follower can return a stale value. With it off the stream
// leader answers every read.
//
// [New] returns once each bucket's stream answers a publish sent through
// the connection's server. A stream just created is led by one server and
// its interest reaches the others of a cluster a little later; a publish
// through them meanwhile finds no responders. New's probe publishes to
// the key spate-ready-probe expecting a sequence no key can hold, so the
// stream refuses it and stores nothing; it waits out no responders for at
// most five seconds, then fails Retryable (no stream leader, or no
// quorum). It needs the publish permission the writes need anyway.
//
// # Revisions and compare-and-swap
//
// Revisions are the bucket's stream sequences: bucket-wide, strictly
// increasing per key across delete and re-create. Create and Update publish
// with an expected last sequence for the key's subject (0 for Create).
// "Wrong last sequence" (10071) is decided by the stream leader against the
// key's stored revision and means Lost. On replicated streams the leader
// also refuses a write with 10164 when another write of the same key is
// still being replicated; that is not an answer yet (the other write may
// fail, and reads still show the old revision until it is applied), so the
// driver sends the write again, for up to two seconds, until the leader
// answers with success or 10071. Reporting 10164 as Lost made concurrent
// compare-and-swap on a healthy R3 cluster non-linearizable: a read after
// the Lost still returned the revision the Lost had declared gone, and
// reporting it Retryable would fail plain contention on a healthy cluster.
// That is the driver's one exception, kept for correctness, to the store
// contract's one attempt per call ([spate.Store]); otherwise it makes one
// attempt per call, and turns off nats.go's own resend of a publish that
// found no responders (it reports that Retryable: nothing was written).
//
// Create of a deleted or expired key (whose subject holds a delete or limit
// marker) is likewise one read of the marker and one publish at the
// marker's sequence, repeated (four rounds at most) only while the marker
// moves under it, so Create loses only after a read saw a live value.
//
// Delete publishes a delete marker, guarded by the expected last sequence when
// a revision is given, and reports the marker's sequence. A guarded delete of
// an absent key loses; an unguarded one wins (and leaves a marker).
//
// The store does not have the optional [spate.Releaser] capability: the
// two keyspaces are two buckets, so two streams, and JetStream has no
// write that spans two streams atomically. The coordinator's release stays two
// calls (the owner-clear Update, then the guarded lease Delete), and the
// conformance suite skips the Releaser rules, saying so.
//
// Nor does it have the optional [spate.Sessioner] capability: a KV bucket's
// per-key TTL (limit markers) has no shared lifetime that one call renews,
// so the coordinator renews each lease with its own Update, and the
// conformance suite skips the session rules.
//
// A deviation the server cannot help with: an Update or guarded Delete whose
// expected revision is exactly the revision of the key's delete or expiry
// marker (as a watch reports it) finds the subject at that sequence and wins,
// although the key is absent. Spate only updates revisions it read from
// values; other callers must do the same.
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
// message, at most [ExpiryLatency] after the deadline (measured: about 0.35 s),
// an expired key still reads as live and a Create of it loses. The driver
// does not hide such keys by comparing timestamps with its own clock, which
// clock skew would turn into early expiry of live leases.
//
// # Watches
//
// A watch is one ordered consumer over the prefix's subjects that delivers
// every message still in the stream (history 1: each key's current value or
// marker), then every new one, in stream order; a goroutine pulls it as fast
// as the server sends. The snapshot folds those messages until every key of
// the bucket's subject index (read when the watch opens) has been through
// the fold and the consumer has caught up; then come the snapshot's puts,
// one [spate.WatchSnapshotDone] and the live events of the same consumer, so
// there is no gap between snapshot and live stream. An empty bucket gets its
// SnapshotDone at once. Delete and limit markers become deletes. Prefixes
// that end in the middle of a key segment ("spl") are matched exactly: the
// subject filter covers the enclosing segment and the driver filters by
// string prefix.
//
// History is 1, so the server keeps only a key's newest revision: a revision
// superseded before the server sent it to the consumer is never delivered,
// and the watch goes straight to the newer one. Watches coalesce: they never
// skip a key's latest revision or reorder a key's revisions, but a watcher
// that lags a fast writer of one key by two writes misses the one between.
// The store contract allows exactly this (a watcher's view must converge to
// the store's; superseded revisions may coalesce). A reader
// more than 4096 events behind, a consumer that cannot be re-created and a
// closed connection end the watch with a Retryable [spate.WatchError]. A
// watch that has had no message for 1.5 s asks the server about its
// consumer; one that holds messages for it, or that the server no longer
// has, or no answer, twice in a row, and the watch deletes the consumer for
// nats.go to re-create after the last message delivered (nothing lost or
// repeated); twice more, and the watch breaks Retryable. A change reaches
// the watch, or the watch breaks, within [WatchStallBound] of its write: a
// watch is never silent about a change for longer.
//
// The store has the optional [spate.KeyWatcher] capability, natively:
// WatchKeys is the same watch over one ordered consumer whose filter
// subjects are the listed keys' exact subjects, so the server sends it only
// their messages (the last of each, then every new one) and a worker's watch
// traffic grows with the keys it watches, not with the job's writes. Its
// snapshot waits for the listed keys that hold a message, found by one get
// per key (16 at a time) rather than the subject index, whose single filter
// would often cover the whole keyspace.
//
// The server pays at creation: it checks every pair of filter subjects for
// overlap, so creating the consumer takes time quadratic in the keys (on one
// embedded server: about 1 ms for 64 keys, 7 ms for 256, 0.13 s for
// [spate.MaxWatchKeys]), and again each time the ordered consumer is
// re-created. A watch of 1024 keys of 256 bytes reached its SnapshotDone in
// about 0.4 s on one embedded server and 1 s on a 3-node R3 cluster. The
// create request carries every subject: up to about 330 KB for 1024 keys of
// 256 bytes, under the default 1 MiB max_payload; a server with a smaller
// max_payload refuses a watch of too many keys with a Fatal error that says
// so. Afterwards a write reaches the consumer through the stream's index of
// consumer filters, as for any consumer, and a write of a listed key costs
// the server up to one string comparison per listed key.
//
// # Listing
//
// List reads the key set from the stream's subject index (one request; the
// index is exact at one instant, markers included) and then gets each key, 16
// at a time: 1 + N round trips, where N counts deleted keys whose markers the
// durable bucket still holds. It never under-reports: a key live for the
// whole call is in the index and its get finds it.
//
// # Permissions
//
// A NATS user that runs job myjob needs exactly these permissions
// ([Permissions] returns them for any job), here as nats-server
// configuration; the account needs JetStream:
//
//	authorization {
//	  users = [
//	    {
//	      user: spate
//	      password: change-me
//	      permissions: {
//	        publish: {
//	          allow: [
//	            "$JS.API.INFO"
//	            "$JS.API.STREAM.INFO.KV_spate_coordination_myjob_state"
//	            "$JS.API.STREAM.CREATE.KV_spate_coordination_myjob_state"
//	            "$JS.API.STREAM.MSG.GET.KV_spate_coordination_myjob_state"
//	            "$JS.API.CONSUMER.CREATE.KV_spate_coordination_myjob_state.>"
//	            "$JS.API.CONSUMER.MSG.NEXT.KV_spate_coordination_myjob_state.*"
//	            "$JS.API.CONSUMER.DELETE.KV_spate_coordination_myjob_state.*"
//	            "$JS.API.CONSUMER.INFO.KV_spate_coordination_myjob_state.*"
//	            "$KV.spate_coordination_myjob_state.>"
//	            "$JS.API.STREAM.INFO.KV_spate_coordination_myjob_lease"
//	            "$JS.API.STREAM.CREATE.KV_spate_coordination_myjob_lease"
//	            "$JS.API.STREAM.MSG.GET.KV_spate_coordination_myjob_lease"
//	            "$JS.API.CONSUMER.CREATE.KV_spate_coordination_myjob_lease.>"
//	            "$JS.API.CONSUMER.MSG.NEXT.KV_spate_coordination_myjob_lease.*"
//	            "$JS.API.CONSUMER.DELETE.KV_spate_coordination_myjob_lease.*"
//	            "$JS.API.CONSUMER.INFO.KV_spate_coordination_myjob_lease.*"
//	            "$KV.spate_coordination_myjob_lease.>"
//	          ]
//	        }
//	        subscribe: {
//	          allow: [
//	            "_INBOX.>"
//	          ]
//	        }
//	      }
//	    }
//	  ]
//	}
//
// In operator mode the same subjects go to `nsc edit user --allow-pub` and
// `--allow-sub`. $JS.API.INFO is asked when the store opens;
// STREAM.INFO and STREAM.CREATE adopt or create the buckets' streams
// (CREATE may be left out when the buckets exist before the first worker
// starts); STREAM.MSG.GET serves reads (direct get is off, see Buckets);
// CONSUMER.CREATE, MSG.NEXT and DELETE run the ordered consumers behind
// watches (DELETE when one is reset), and CONSUMER.INFO lets a watch check
// that its consumer still delivers (without it, watches run unchecked and
// the first refusal logs a warning); $KV.<bucket>.> takes the writes; every reply
// comes back on an inbox, so a connection made with
// nats.CustomInboxPrefix needs "<prefix>.>" instead of "_INBOX.>".
// Allowing "$JS.API.>" and "$KV.>" is simpler and also works, at the cost
// of letting the user touch every stream of the account.
//
// The job administration of a nats:// store URL (listing jobs, reading a
// job's recorded TTL, deleting a job) is not a worker's business and needs
// more: publish on "$JS.API.STREAM.NAMES" to list, and on
// "$JS.API.STREAM.DELETE.KV_spate_coordination_myjob_state" and
// "..._lease" to delete. Those calls run on connections of their own and
// do not get the fast permission errors below.
//
// nats.go reports a refused subject only to the connection's asynchronous
// error handler: the request behind it goes unanswered until its context
// ends. [New] therefore chains a handler in front of the connection's
// (set yours before New; replacing it afterwards turns the fast errors back
// into timeouts until the next store opens on the connection), and a call
// or a watch whose subject the server refuses fails at once with a Fatal
// error that names the subject and the permission to grant, for example
//
//	nats: open: permission denied: the NATS user may not publish to
//	"$JS.API.INFO": grant it publish permission on "$JS.API.INFO" ...
//
// # Errors
//
// Timeouts, disconnection, no responders and cancelled contexts are
// Retryable; a Retryable write may have landed. Bad credentials, missing
// permissions, TLS verification failures, JetStream disabled, an old server,
// a bucket with the wrong settings, a deleted bucket and a connection closed
// by its owner are Fatal. One TLS misconfiguration is ambiguous: a server
// that requires a client certificate refuses a client without one only after
// the TLS 1.3 handshake, and when the connection is already closed by the
// time the client notices, nats.go reports it like a reset connection
// (nats.ErrTLS over EOF or a broken pipe), which stays Retryable.
package nats
