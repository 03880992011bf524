// Command spate runs a coordinated backfill and the tools to operate it.
//
//	spate demo                                      # the whole product in under a minute
//	spate backfill --src DIR --dst DIR [flags]      # a worker of a coordinated job
//	spate inspect  [--store URL] [--job NAME] [--json]
//	spate jobs     [--store URL] [--long]
//	spate requeue  SPLIT [--yes] [--store URL] [--job NAME]
//	spate delete   --job NAME [--force] [--yes] [--store URL]
//	spate verify   --src DIR --dst DIR
//	spate ui       [--store URL] [--job NAME] [--addr HOST:PORT] [--ui-token-file FILE]
//	spate conformance --store URL [--coordinator]
//	spate --version                                 # the build: version, commit, Go toolchain
//
// Every command prints its flags with -h. Logs go to stderr (--log-format
// text|json, --log-level); results go to stdout.
//
// # backfill
//
// spate backfill copies every line of every file under --src into --dst as
// one job that any number of processes share. The elected leader packs the
// files into splits (--split-bytes, --split-files; both are part of the
// job's identity), the workers lease them (--lanes at a time), and progress
// is committed with fenced compare-and-swap writes every --commit-interval.
// Output is exactly once: a worker stages its lines under --dst/.spate/stage,
// fsyncs them at each commit, and the commit lists them in the split's
// progress record by the same compare-and-swap as the watermark; only after
// that commit won are they copied into the split's published file. A worker
// that dies (or freezes) loses its leases after --lease, and a peer resumes
// its splits from their last commit: it first finishes the publish the
// record lists, then discards what the dead worker staged past it.
//
// Output goes to --dst/<split>.out (one file per split, whoever copied it;
// --dst/.spate/job names the job that owns --dst, and --dst/.spate/plan the
// plan on the store that writes it: a new plan over another plan's output,
// and a worker whose --src, --dst or split options differ from the job's,
// are refused). --dst may be a bucket
// URL (s3://bucket?region=…&prefix=out/, file:///path, and with the build
// tags gs:// and azblob://): a split's output is then a sequence of parts,
// <split>/NNNNNNNN.out, each staged under .spate/stage/ once 8 MiB or 10 s
// of lines accumulated (or the split ends) and copied to its name after the
// commit listing it won (see package pipeline/blobsink). One line per
// input line:
// "<path relative to --src>:<byte offset of the line's first byte>" TAB
// "<line>". The key identifies every input line, so spate verify (and a
// backfill whose job completed, unless --verify=false) can check that every
// input line arrived intact. Input file names holding a tab or a newline
// cannot be verified. The verification re-reads --src: a file changed since
// the job was planned shows up as missing or damaged lines.
//
// A --src directory's regular files are read recursively. Symbolic links
// to regular files are followed (the output and the verification name the
// link), and --src may itself be a link to a directory; a link to a
// directory inside it, or a link whose target is missing, is refused before
// the job starts (following directory links could loop or read files
// twice). Devices, pipes and sockets are skipped.
//
// The job name defaults to the source directory's base name and a hash of
// its absolute path. Running backfill again resumes the job; on a finished
// job it says so and exits 0. A worker's first SIGINT or SIGTERM stops it
// gracefully: it stops reading, hands its unfinished splits back (peers
// resume them from their last commit), flushes the sink, commits, prints its
// summary and exits 130 or 143. A second signal exits at once.
//
// A split whose input cannot be read (a file missing or shorter than
// planned) is failed; after --max-attempts it is quarantined, and once
// nothing else is left the job is stalled: backfill exits 3 and prints the
// spate inspect and spate requeue commands to run (on mem://, whose state
// ends with the process, it says so and to run the job again into an empty
// --dst instead).
//
// --rate caps the lines per second a worker reads (a pacing stage at the
// head of the pipeline, so input is not read ahead of the rate: a graceful
// stop then has unread splits to hand back).
//
// A terminal gets a progress bar, fitted to the terminal's width (the
// window size, else $COLUMNS, else 80 columns); otherwise backfill prints a
// progress line every five seconds. Event lines (gained, completed, lost, handed back,
// quarantined) go to stdout unless --quiet.
//
// # Stores
//
// --store selects the coordination store by URL. The command opens it
// through package storeurl, where every driver registers its schemes; the
// command itself imports no backend client.
//
//   - mem:// — in this process only (one worker; tests and trials). jobs,
//     delete, inspect and requeue refuse it: no other process can reach it.
//   - etcd://[user:pass@]host:port[,host:port...] and etcds:// (TLS) — an
//     etcd cluster, the production default. The job's keys live under
//     /spate/<job>/ (?prefix=/other/ moves the root). TLS also with
//     --ca-file, --cert-file, --key-file (then the endpoints are https);
//     auth with --user and --password. Leases are whole seconds, at least
//     the server's floor (2 s with etcd's default timing).
//   - redis://[user:pass@]host:port[/db] and rediss:// (TLS) — a Redis
//     primary that allows Lua scripts; keys under spate:{<job>}:. go-redis's
//     own URL parameters pass through. Redis records a job's lease, so
//     every worker and tool must use the same --lease (inspect, requeue,
//     jobs and delete read it from the store).
//   - nats://host:port[,host:port...] (or a list of nats:// URLs) and
//     tls://... — NATS JetStream KV (server 2.11 or newer), one bucket pair
//     per job (spate_coordination_<job>_state and _lease). ?replicas=3 (or
//     5) sets the buckets' replicas (default 1: development only;
//     production wants 3 and the servers' sync_interval: always);
//     ?creds=FILE or --creds a credentials file. Auth with --user and
//     --password, or a token (--token, or nats://TOKEN@host); TLS with
//     --ca-file, --cert-file, --key-file. The lease bucket's max age is the
//     job's lease: every worker uses the same --lease.
//
// Every scheme takes the URL parameters ca_file, cert_file and key_file
// (TLS material, PEM) and password_file and token_file (a secret read from
// a file). A flag beats the URL: --user over the URL's user; --password,
// --password-file or $SPATE_STORE_PASSWORD (the first set) over
// password_file and the URL's password; --token, --token-file or
// $SPATE_STORE_TOKEN over token_file. Only NATS uses a token.
//
// A store URL is shown only redacted (storeurl.Redact): in the store's
// description (on stdout, in inspect, in the --history file, in log lines)
// no user info appears at all, and errors and the commands backfill
// suggests mask passwords, tokens and secret-looking query values. A
// password is masked whatever characters it holds: the user info ends at
// the URL's last '@', so an unescaped '/', '?', '#', ',' or '@' in it
// does not let part of it show as a path, a query or a server. A URL with
// an '@' past its server address is refused (write it %40).
//
// Reaching the store at startup (dials, retries of an unreachable store,
// the driver's startup check) takes at most --connect-timeout; then the
// command fails with "could not connect to STORE: --connect-timeout
// elapsed", naming the store it was connecting to.
//
// Without --store, spate uses its default store: a single-member etcd
// embedded in the first spate process (production raft timing, data in
// --data-dir, default ./.spate/etcd, serving clients on --embed-addr,
// default 127.0.0.1:23790; its warnings go to <data-dir>.log). More spate
// processes on the machine find it on that address and join the same job. The
// process that started it hosts it, and records itself in the store (pid,
// host, data directory, worker): the others name it in their "store:" line.
// When its own work is done the host keeps the store up until every other
// backfill process that uses it has exited — one frozen past its lease, or
// still starting, too — and the other workers of every job on it have left
// (a second Ctrl-C stops it at once).
//
// A worker that joined the store probes it every quarter lease. If its host
// dies (SIGKILL, a crash), the worker logs, within a lease, one ERROR line
// "the default store is gone" naming the store's address, the process that
// hosted it, its data directory and the command that brings it back (any
// spate backfill of the job on that --data-dir: the store restarts from its
// data). Brought back, the workers say so and go on with the job. If nobody
// brings it back within --connect-timeout, each stops and exits 1 with the
// same facts (stopping takes at most --drain-timeout more); a SIGINT while
// the store is gone exits 1 too: nothing was handed back.
//
// spate inspect and requeue start it from the data directory when no
// process serves it. A single member survives a crash of the process, not
// the loss of its disk; for a fleet across machines, run an etcd cluster.
//
// # inspect and requeue
//
// spate inspect reads a job's state from its store without joining it: the
// plan (generation, finality, planned splits), the live members and the
// leader, and every split's state, owner, epoch, attempts, committed
// watermark (bytes, of the split's size), remaining bytes (its lag; "?"
// when its size is unknown) and live lease. The state is leased when a
// live worker holds the split's lease, runnable when it waits for a worker,
// or completed or quarantined. --json prints the same for scripts (each
// split's stored status too, and the job's bytes_remaining). Without --job it uses --src's job, or the store's only
// job. A split that follows a file (backfill --follow) shows the file's
// path now (and "found as" the name it was found under, after a rename),
// its lag in bytes and the age of its oldest unread byte, about: measured
// against the file's size now when --src is a directory here, else as its
// last commit recorded; files waiting for a lane are counted. JSON: file,
// found, lag_bytes, lag_seconds, and end (why a completed one completed).
//
// spate requeue SPLIT puts a quarantined split back into play (status
// runnable, attempts reset, owner cleared, epoch bumped: one fenced
// compare-and-swap, so a zombie of an earlier tenancy stays fenced). It asks
// for confirmation on stdin unless --yes.
//
// # jobs and delete
//
// spate jobs lists the jobs a store holds keys of, one per line (nothing on
// stdout for an empty store). --long prints a table of each job's state
// (planning, running, complete, stalled; "no plan" or "unreadable" when it
// cannot say), splits completed and live workers.
//
// spate delete deletes every key of one job: plan, splits, progress,
// leases, presence. It takes the job from --job (or derives it from --src)
// and never picks one by itself. A job with live workers (a presence key
// that has not expired: a killed worker counts until its lease runs out) is
// refused unless --force, since its workers would lose their plan and
// leases and stop with an error. It asks for confirmation on stdin unless
// --yes. The layout knowledge is the driver's (storeurl's DeleteJob): an
// etcd prefix, a Redis key pattern, a NATS bucket pair.
//
// # conformance
//
// spate conformance runs the store conformance suite (the same rules every
// driver's tests run) against a live deployment, and with --coordinator the
// coordinator scenarios too. First it opens a store over a fresh namespace
// (the driver's own startup check: a refused script, a missing ACL grant or
// a TTL below the server's floor fails here, clearly) and prints what the
// driver promises; then it runs the rules in this process
// (conformance.CheckStore, CheckCoordinator) and prints a table of their
// results, with the rule broken for every failure. Every harness uses a fresh
// namespace (job conformance-<random>) and deletes it afterwards. Exit 0
// only if every rule passed.
//
// # demo
//
// spate demo starts an embedded etcd in a temporary directory on a free
// port, generates a corpus, runs three workers (this binary's backfill),
// kills one with SIGKILL mid-run, shows the survivors take its splits over,
// and verifies the output. It exits 0 only if the job completed and every
// input line reached the output.
//
// # History
//
// backfill --history FILE appends one JSON object per line describing what
// this worker saw, for fault testing and post-mortems. Each line is written
// with one write (O_APPEND): complete in the file even if the process is
// killed right after, though not fsynced. Every object starts with "ts"
// (RFC 3339, UTC), "instance" and "ev"; the other fields by event:
//
//	start        job, store, src, dst, pid, lease_ms, lanes
//	gained       split, epoch, resume (committed watermark handed over; null: from the start)
//	open         split, epoch, partition, resume (the lane of a tenancy opened)
//	lost         split, epoch (the lease ended involuntarily)
//	revoke       split (the leader wants it elsewhere; a drain begins)
//	commit       split, epoch, watermark, completed, outcome, error (every commit attempt)
//	release      split, epoch, outcome, error (handed back on a graceful stop)
//	release_drained  split, epoch, outcome, error (handed back after a drain)
//	fail         split, epoch, reason, outcome, error (reported poison)
//	poison       split, reason (the file source's reason)
//	quarantined  split, attempts
//	durable      split, epoch, partition, records, first, last (a sink write that is now durable)
//	all_complete, stalled (completed, quarantined)
//	exit         code
//
// outcome is ok, fenced (the commit wrote nothing: another tenancy owns the
// split), retryable (it may have landed; it rides the next commit) or fatal.
// Offsets are split-relative: a record's offset is that of its line's last
// byte, and a watermark W covers the records with offsets below W. So the
// invariant a checker can test is: every ok commit at watermark W of a
// tenancy (split, epoch) that gained the split at resume R < W follows
// durable lines of that tenancy reaching offset W-1. A durable event's
// records of one partition are in offset order; first and last bound them.
//
// # ui
//
// spate ui serves a live, read-only view of the jobs on a store (one
// other processes reach: not mem://) on --addr, default 127.0.0.1:8089,
// until SIGINT or SIGTERM. It listens on loopback only unless given a
// token for the view: --ui-token-file FILE or $SPATE_UI_TOKEN, which
// browsers then ask for as a password. That token is not the store's:
// --token, --token-file and $SPATE_STORE_TOKEN are the store flags, the
// same on every command.
//
// # Metrics and health
//
// --metrics-addr serves Prometheus /metrics (the spate_coordination_* and
// spate_pipeline_* series, Go and process collectors), /healthz and /readyz
// on backfill, demo and conformance. On backfill it also serves the job's
// live view (what `spate ui` shows, for this worker's job) at /ui/: open on
// a loopback address; beyond loopback only with SPATE_UI_TOKEN set, which
// the browser then asks for as a password (without it /ui answers 403 and
// the metrics stay served).
//
// # Exit codes
//
// 0 success (job complete and verified, already complete, rules passed);
// 1 an error or a failed check; 2 bad flags or arguments; 3 the job is
// stalled on quarantined splits; 130 and 143 after a graceful stop by SIGINT
// and SIGTERM.
package main
