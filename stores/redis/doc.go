// Package redis is a coordination store ([spate.Store]) on Redis 7.0 or
// later, for deployments that run Redis and nothing else. It works over any
// go-redis UniversalClient: a single primary, Sentinel (a failover client)
// or Cluster. Its tests run against real redis-server 7.0 processes: a
// single primary (plain, with ACL and TLS, with AOF across a crash) and a
// one-node Cluster; Sentinel is not tested. [New] refuses an older server
// with a Fatal error (see [MinServerVersion] for why 7.0).
//
// The caller builds and owns the client: [Store.Close] never closes it.
// For tests, stores/redis/redistest spawns a redis-server and gives the
// conformance suite a harness over it.
//
// # What Redis can promise
//
// Every operation is one Lua script. A script runs atomically on the
// primary, so check, write, revision mint and change-log append happen as
// one step, and create and compare-and-swap are linearizable on that
// primary. That is what fencing needs, and it holds for as long as one
// primary serves the job.
//
// It does not hold across a failover. Redis replicates asynchronously (WAIT
// is documented as best effort and does not make Redis strongly
// consistent), so a promoted replica may lack the newest writes: a fencing
// epoch can go backwards and two owners can both pass the check.
// [spate.Capabilities.LinearizableFailover] is false, and fencing across a
// Sentinel or Cluster failover is best effort. Use etcd when that matters.
//
// For committed writes to survive a crash of the server process, run it
// with appendonly yes and appendfsync always: an acknowledged script's
// effects are then on disk before the reply. With the default everysec, about
// a second (at worst two) of acknowledged commits can be lost on a crash; without AOF,
// everything since the last snapshot.
//
// Keys carry no Redis TTL, so a maxmemory-policy of allkeys-* could evict
// them: use noeviction or a volatile-* policy. [New] refuses a server with a
// memory limit and an allkeys-* policy (read from INFO) with a Fatal
// error.
//
// # Keys
//
// Every key of a job starts with "spate:{Job}:". The braces are a Redis
// Cluster hash tag: all of a job's keys hash to one slot, so every script
// can touch all of them. One job lives on one shard; jobs spread over the
// cluster. Two jobs share nothing.
//
// That is what gives the store the optional [spate.Releaser] capability:
// UpdateAndDelete, the coordinator's release, is one script over both
// keyspaces' keys. It runs the durable compare-and-swap and, if it wins,
// the guarded ephemeral delete; each change takes its own keyspace's next
// revision and its own change-log entry and notification, exactly as
// Update and Delete would, so watchers of each keyspace see it as usual.
//
// The store does not have the optional [spate.Sessioner] capability: each
// ephemeral key has its own deadline in the keyspace's sorted set and Redis
// has no lifetime that keys share and one call renews, so the coordinator
// renews each lease with its own Update, and the conformance suite skips
// the session rules.
//
// Each keyspace keeps a sorted index of its live keys (prefix ranges with
// ZRANGEBYLEX), a hash of values, a hash of revisions, a revision counter
// (INCR), the change log (a stream, XADD with MAXLEN ~ [Options.ChangeLogLength])
// and, for the ephemeral keyspace, a sorted set of deadlines. A meta hash
// records the key layout and the TTL; opening a job with another TTL is a
// Fatal error, since clients with different TTLs would disagree on expiry.
//
// Revisions come from the keyspace's counter, so they strictly increase
// per key across delete and re-create. Each revision has exactly one change
// log entry, whose stream ID is the revision itself. Revisions pass through
// Lua numbers, which are exact up to 2^53: some 285 years at a million
// writes a second.
//
// # Expiry
//
// An ephemeral key expires one TTL after its last write, on the server's
// clock (the scripts read TIME). Nothing here needs keyspace notifications
// or CONFIG SET, which managed Redis services often forbid:
//
//   - Every read and write treats a key past its deadline as absent and
//     deletes it on the spot, logging the delete at a fresh revision, so
//     Get, List and Watch snapshots never return an expired key.
//   - Every client runs a sweep script every [Options.SweepInterval] that
//     deletes the keys past their deadline and logs each delete, so watchers
//     hear of an expiry even when nobody touches the key.
//
// An expiry therefore reaches watchers at most one sweep interval plus a
// round trip after the deadline ([spate.Capabilities.ExpiryLatency] is
// SweepInterval + [ExpirySlack]); with several clients sweeping at
// independent phases it is usually sooner. Measured on loopback with a
// 1.5s TTL: median about 130ms and max about 230ms with the default 250ms
// interval, median about 25ms with a 50ms interval.
//
// # Watch
//
// Every write script also publishes its change (SPUBLISH) on a shard channel
// named like the keyspace's change log. A store holds one subscriber
// connection (outside the client's pool), opened with its first watch,
// that subscribes to a keyspace's channel while a watch of it is open and
// hands each change to all the store's watches of that keyspace. A watch
// runs one script that returns the live keys under the prefix together with
// the keyspace's last revision, and is registered with the subscriber before
// that, so every later change reaches it. The change log stays the source
// of truth: a watch reads it with a non-blocking XREAD from its last
// revision whenever a notification skips a revision, when the subscriber
// reconnects, when it falls behind its buffer, and once a second while it
// hears nothing, so a lost notification (a broken subscriber connection, a
// write by an older client that does not publish) delays an event by up to
// about two seconds but never loses it. A watch filters by prefix on the
// client, so a watch on a narrow prefix still receives the keyspace's whole
// log. A watcher that falls more than ChangeLogLength changes behind, or
// whose read of the log fails, gets a Retryable [spate.WatchError] and
// re-watches. Watches hold no pooled connection; a cancelled watch's
// channel closes at once, and Close returns promptly.
//
// # Watching keys
//
// The store has the optional [spate.KeyWatcher] capability, natively. Every
// write script (and so every expiry) publishes its change a second time,
// on the key's own shard channel, named like the change log followed by
// ":" and the key; the job's hash tag keeps it in the job's slot. A key
// watch registers its keys with the store's subscriber, which subscribes
// to the channels of the keys its watches want (several per SSUBSCRIBE,
// one subscription per key however many watches want it, let go with the
// last) and to no keyspace channel unless a prefix watch is open. Once the
// server has confirmed all of the watch's channels, one script reads the
// listed keys with the keyspace's last revision: the snapshot. The server
// then sends the store only the changes of watched keys, and the client
// filters nothing. A key watch has no log of its own keys, so when it may
// have missed a notification (the subscriber reconnected, the watch fell
// behind its buffer) it ends with a Retryable [spate.WatchError] and the
// consumer re-watches, which re-reads only its keys. Nor does it read the
// log once a second as a prefix watch does, so a write by a client of an
// older version of this driver, which does not publish on the key's
// channel, never reaches it: upgrade every client of a job before any
// watches keys. Without
// [PushCommands] a key watch reads the keyspace's change log once a second
// and keeps its keys' changes, as a prefix watch does.
//
// Its cost to the server: a second SPUBLISH in every write, which with no
// subscriber on the key is a lookup in the slot's channel table, measured
// at about 0.3µs of server time per write (200,000 publishes of a
// 256-byte value in one script, Redis 7.0) against 8 to 14µs for the
// write itself measured the same way and a loopback round trip of 35 to
// 50µs, too small for BenchmarkStoreUpdate to resolve; an entry in the
// server's shard channel table per watched key; and one message per
// change of a watched key to each store watching it.
//
// # Errors
//
// Each call makes exactly one attempt. Scripts are sent with a no-retry
// flag, because go-redis retries a command whose connection broke, and a
// second run of a create or compare-and-swap whose first reply was lost
// would see its own write and report Lost for a write that won; the driver
// reports a Retryable error ("may have landed") instead.
//
// Network errors, timeouts, a cancelled context and the server replies
// LOADING, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, BUSY, NOREPLICAS and
// OOM are Retryable. NOAUTH, WRONGPASS, NOPERM, unknown commands, script
// errors, alien data under the job's keys (WRONGTYPE), TLS verification
// failures and a client closed by its owner are Fatal.
//
// Context deadlines bound socket I/O only when the client has
// ContextTimeoutEnabled set; otherwise its ReadTimeout and WriteTimeout do.
// New logs a warning when it is off.
//
// # ACL, TLS and startup
//
// New runs a bounded startup check: it runs a small script with EVAL and
// with EVALSHA (EVALSHA falls back to EVAL whenever the server's script
// cache is empty, as after a restart, so both are needed), probes every
// command the scripts call, and reads the change log once. A server with
// EVAL renamed, an ACL user denied any of [RequiredCommands] or the job's
// keys, or a wrong password is a Fatal error naming what is missing. The
// ACL that grants everything the driver does ([ACLRules]):
//
//	ACL SETUSER spate on >secret ~spate:* &spate:* +eval +evalsha +xread +time +incr +get +xadd +zadd +zrem +zrangebylex +zrangebyscore +zscore +hget +hset +hdel +spublish +ssubscribe +sunsubscribe +info +config|get +scan +exists +del
//
// Only [RequiredCommands] and the key rule are needed to run a job. The
// channel rule (&spate:*) and [PushCommands] make watches push-based:
// without them New and every write still succeed, the store logs a
// warning naming the denied command, and its watches (key watches too)
// read the change log once a second instead of hearing of changes.
// [CheckCommands] let New verify the server's persistence settings (an
// unverified one is reported unmet), and [NamespaceCommands] serve the
// job operations (listing and deleting jobs).
//
// TLS is the client's business: set TLSConfig on the go-redis options.
//
// # Cluster and Sentinel
//
// On Cluster, pass a ClusterClient; a job's scripts all go to the shard
// owning its slot, and its watches' subscriber subscribes on that shard
// (sharded pub/sub, so notifications stay on it); when the slot moves the
// subscriber resubscribes and the watches catch up from the log. The ACL user also
// needs +cluster|slots, which go-redis uses to read the slot map. On Sentinel, pass a
// failover client. In both cases a failover is survived operationally
// (errors are Retryable until the client finds the new primary) but not for
// fencing, as said above. Scripts must reach the primary: do not route
// them to replicas.
//
// # Cost
//
// A compare-and-swap is one round trip. On loopback it costs about 1.1 to
// 1.3 times a bare compare-and-swap script (see BenchmarkRawScriptCAS and
// BenchmarkStoreUpdate). Every client sweeps every SweepInterval, one tiny
// script each time. The change logs hold up to ChangeLogLength changes,
// values included, per keyspace.
package redis
