// Package etcd is the etcd v3 coordination store, spate's default
// production backend: a [spate.Store] over go.etcd.io/etcd/client/v3
// (tested against etcd v3.7.3).
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
//	...
//	store, err := etcd.New(ctx, cli, etcd.Options{Prefix: "/spate/backfill-2024/", TTL: 10 * time.Second})
//
// The caller builds and owns the client (endpoints, TLS, credentials,
// keepalives); the store never closes it. [Store.Close] ends only what the
// store started: its watches and its lease-revocation goroutine.
//
// For tests, stores/etcd/etcdtest runs a real etcd inside the test process
// and gives the conformance suite a harness over it.
//
// # Mapping
//
// Every key lives under Options.Prefix, one prefix per job (and tenant):
// durable keys under Prefix+"durable/", ephemeral keys under
// Prefix+"ephemeral/". Jobs whose prefixes do not nest never read, write,
// watch or list each other's keys; the prefix must end with '/', so
// "/spate/a/" and "/spate/ab/" stay apart.
//
// Revisions are etcd's ModRevision: the cluster-wide revision counter, which
// strictly increases across delete and re-create (Version, which restarts,
// is never used).
//
//   - Create: Txn(CreateRevision(key) == 0 → Put).
//   - Update: Txn(ModRevision(key) == expected → Put).
//   - Delete with a revision: Txn(ModRevision(key) == expected → Delete);
//     without one, a plain Delete that always wins. The outcome carries the
//     delete's own revision (0 if the key was already absent).
//   - Get: a linearizable range read of one key; absent keys are absent.
//   - List: a linearizable prefix range read, paged 1000 keys at a time at
//     one revision, sorted by key.
//   - Watch: a List at revision R (the snapshot), SnapshotDone, then an etcd
//     watch from R+1 over the prefix, so nothing falls between them.
//   - WatchKeys (the optional [spate.KeyWatcher] capability): the listed
//     keys read at revision R by transactions of Gets, SnapshotDone, then
//     one etcd watch per key from R+1 (see below).
//   - UpdateAndDelete (the optional [spate.Releaser] capability, which the
//     coordinator's release uses): one Txn(ModRevision(durable) ==
//     expected → Put durable, Txn(ModRevision(ephemeral) == leaseExpected
//     → Delete ephemeral)). Both writes carry the transaction's revision
//     and reach watchers together; a lost inner guard leaves the put in
//     place.
//
// Each call makes one attempt. (clientv3 itself retries reads, and writes
// that provably never reached a server, on other endpoints.)
//
// WatchKeys is native: the server sends the watcher the listed keys' events
// only. The snapshot is one transaction of up to 128 Gets (etcd's default
// --max-txn-ops; a server that allows fewer gets smaller ones), and for
// more keys further transactions read at R too, so 1024 keys cost 8
// linearizable reads. Then each key gets its own etcd watch from R+1, all
// on the client's one gRPC watch stream (clientv3 multiplexes the watches
// of one context); the driver merges them with one goroutine per 32 keys,
// and clientv3 runs one per watch (a 200-key watch adds about 210
// goroutines to the client). On the server each is one watcher in an index by exact key: a
// write finds its key's watchers with a map lookup, not a scan of every
// watcher, and writes to unlisted keys cost this watcher nothing. Opening the watches
// takes one round trip per key (clientv3 registers them one at a time, in
// the background while the snapshot is delivered); a watch that starts
// behind the current revision is caught up by the server's 100 ms sync, so
// the first changes may arrive up to ~100 ms late. A compaction past R+1, a
// watch the server cancels or any key's watch closing ends the whole
// stream Retryable, as for Watch.
//
// # Ephemeral keys and leases
//
// etcd expires keys through leases. Every ephemeral write grants a fresh
// lease of TTL seconds and attaches it in the same transaction as its
// compare-and-swap, so a won Update re-arms the TTL atomically: it is the
// heartbeat. The deadline counts from the grant, one round trip before the
// write applies, so a key expires up to one round trip early relative to its
// write and, while the leader is stable, no later than [ExpiryLatency]
// after its deadline (the leader scans for
// expired leases every 500 ms and commits each revocation through raft;
// measured on the embedded test server: 20–480 ms). Expiry takes effect at
// that revocation, at once for every primitive: until then the key is live
// (reads return it, and a late heartbeat still wins); from then on it is
// absent, re-creatable, and watchers receive a delete at the revocation's
// revision.
//
// A lease carries exactly one key. A write that loses its condition revokes
// its lease before returning; the lease of a key that is rewritten or
// deleted is revoked in the background; the lease of a write that failed
// with an error is left alone (the write may have landed on it) and expires
// unused within one TTL. So the cluster holds about one lease per live
// unbound ephemeral key. The cost is two raft proposals per ephemeral write
// (grant, transaction) and one more for the revocation (after a TimeToLive
// read that finds the lease empty), against one for a durable write.
//
// # Sessions
//
// The store has the optional [spate.Sessioner] capability, natively: a
// session is one etcd lease granted with the store's TTL, plus a marker key
// (Prefix+"session/<lease id>", outside both keyspaces) attached to it. A
// session's Create and Update are the Create and Update transactions above,
// putting the key on the session's lease instead of a fresh one, so a bound
// key costs one raft proposal per write and no grant. KeepAlive is one
// LeaseKeepAlive round trip (clientv3 KeepAliveOnce) to the leader, which
// resets the lease to its full TTL when the request reaches it (after the
// call began, so the bound keys live at least one TTL from the call): it
// writes no key, moves no revision and proposes nothing to raft (with
// --experimental-enable-lease-checkpoint-persist, a lease that was
// checkpointed costs one checkpoint proposal on its first renewal), so a
// worker renews N bound keys with one RPC instead of N transactions. A lease
// the server no longer knows (expired, or revoked) makes every session call
// fail with [spate.ErrSessionExpired] and Fatal; transport trouble is
// Retryable, and a KeepAlive that fails Retryable may have renewed the
// lease. The bound keys expire together when the lease does, within
// [ExpiryLatency] of one TTL after the leader last renewed it (a leader
// change restarts the countdown, as for any ephemeral key). Close revokes
// the lease: one raft proposal deletes every bound key, each delete reaching
// watchers. A session costs one lease, two raft proposals to start (grant,
// marker) and one to end, and one keepalive RPC per renewal.
//
// The marker exists for the background revocation of superseded leases: it
// revokes a lease only after a TimeToLive read finds no key attached, and a
// session's lease always carries its marker, so rewriting or deleting a
// key bound to a session (a [spate.Store.Update] unbinds it, putting it on a
// fresh lease) never ends the session.
//
// TTL must be a whole number of seconds (lease resolution) and at least the
// server's minimum lease TTL, which etcd sets to 1.5 election timeouts
// rounded up to whole seconds: 2 s with the default timing (100 ms
// heartbeat, 1 s election timeout). New measures the floor (a one-second
// grant comes back raised to it), reports it as Capabilities.TTLFloor, and
// refuses a TTL below it.
//
// # Errors
//
// Losing a condition is an outcome, not an error. Errors keep etcd's own
// error (errors.Is works with go.etcd.io/etcd/api/v3/v3rpc/rpctypes) and add
// the class:
//
//   - Retryable: a cancelled or expired context, no leader, leader changed,
//     server timeouts, overload, unreachable endpoints, a compacted
//     revision, a broken watch. A write that fails Retryable may have
//     landed.
//   - Fatal, with what to fix in the message: a wrong password or invalid
//     token, missing user, permission denied on the prefix, a request over
//     the server's --max-request-bytes (also [spate.ErrValueTooLarge]), the
//     NOSPACE alarm, data corruption, a client its owner has closed.
//   - A value over Options.MaxValueSize is [spate.ErrValueTooLarge], an
//     invalid key [spate.ErrInvalidKey]; nothing is sent.
//
// # The startup check
//
// New proves the cluster usable before returning, within
// Options.StartupTimeout: a linearizable count over the prefix (quorum,
// credentials, read permission), a transaction whose condition never holds
// but whose operations cover both keyspaces (the server checks write
// permission on every operation of a transaction, applied or not), and a
// one-second lease grant (the TTL floor). So a wrong password, a missing
// permission or a TTL below the floor is a Fatal error at startup.
//
// When the check cannot reach an answer, New diagnoses without matching
// error strings: if no endpoint accepts a TCP connection the cluster is
// unreachable, which is Retryable (the server may be starting; the caller
// retries). If an endpoint accepts TCP but a fresh gRPC connection made with
// the client's own credentials fails its first attempt, the TLS setup or the
// protocol does not match (untrusted server certificate, client certificate
// the server rejects, missing client certificate, http:// against a TLS
// listener): that is Fatal, and the message quotes gRPC's reason. New
// therefore returns within StartupTimeout plus at most 3 s, never hangs.
//
// clientv3.New itself authenticates when given a user name and password, so
// a password that is wrong from the start fails there, with
// rpctypes.ErrAuthFailed; New reports credentials that went bad since (a
// rotated password) as Fatal.
//
// # Running it in production
//
// Cluster size: 3 members tolerate one failure, 5 tolerate two; more only
// slow writes down. A single member has no fault tolerance. Give etcd fast
// disks: every write waits for a raft round trip and an fsync (etcd's docs
// measure about 580 puts/s for one client on one connection; a commit
// through this driver is one transaction, so one worker's commit rate is
// latency-bound, and many workers scale to tens of thousands per second).
//
// Lease sizing: the TTL must comfortably exceed the election timeout. A
// leader change stalls writes (heartbeats included) for about one election
// timeout, and the new leader restarts every lease's countdown with one
// election timeout to spare, so keys outlive their deadline by up to a TTL
// after a failover, never the reverse. With etcd's defaults (1 s election
// timeout) a split lease of 10–30 s renewed every third of it is
// conventional; below 5 s, a slow disk or a failover can cost leases.
// Across regions raise --heartbeat-interval and --election-timeout first,
// then the TTL.
//
// Compaction and watches: etcd keeps every revision until compacted. Run
// auto-compaction (for example --auto-compaction-mode=periodic
// --auto-compaction-retention=1h) and defragment now and then, or the
// database grows until the NOSPACE alarm stops all writes. A watch that
// resumes (after a connection blip) from a revision that has since been
// compacted cannot be resumed: the stream ends Retryable, and the consumer
// re-watches from a fresh snapshot, which is what the coordinator does. Any
// retention longer than a reconnect is enough; an hour is generous.
//
// Auth and TLS: enable client TLS (--cert-file, --key-file,
// --trusted-ca-file, --client-cert-auth) and authentication, and give each
// job a user whose role has readwrite on exactly its prefix range
// (etcdctl role grant-permission ROLE readwrite /spate/JOB/ --prefix). Pass
// the TLS config and credentials in the clientv3.Config.
//
// Limits: --max-request-bytes (default 1.5 MiB) must exceed MaxValueSize
// (default 1 MiB) by 4 KiB; --max-txn-ops (default 128) must be at least 2.
// Keep values small in any case: etcd replicates and stores every revision
// of every value until compaction.
//
// # What etcd guarantees
//
// Jepsen's analysis of etcd 3.4.3 (2020) found key-value operations,
// multi-key transactions included, strict serializable under process
// pauses, crashes, clock skew, network partitions and membership changes,
// and watches delivered changes in order. etcd's own robustness suite
// records client histories and checks them with porcupine, as this
// package's failover test does (a 3-member cluster whose leader is killed
// mid-run: the compare-and-swap history stays linearizable and no won
// increment is lost). So Capabilities.LinearizableFailover is true: fencing
// holds across member failover, because the fence is the condition of the
// same transaction that writes. (etcd's lock recipe, by contrast, is not a
// safe lock on its own; spate never relies on it.)
//
// Past etcd bugs that robustness testing caught (a single-member cluster
// losing a write on crash, revisions going backwards after a crash during
// compaction, watch events lost or duplicated after partitions) are fixed in
// current releases; run a current v3.5+ release (v3.7.x is what this
// package is tested against). [New] asks every endpoint for its version and
// refuses a member older than [MinServerVersion] with a Fatal error.
//
// Durability: a write is acknowledged once a majority of members has it in
// its fsynced raft log. It survives the crash or loss of a minority of
// members; a single-member cluster survives a process crash but not the loss
// of its disk.
package etcd
