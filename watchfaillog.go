package spate

import (
	"log/slog"
	"time"
)

// A watch that cannot be re-established is retried every few hundred
// milliseconds for as long as the store stays away (a worker whose store
// host died retries until its bound ends it), and a WARN per try buried
// the one line that says what happened. watchFailLog says the failure
// once, then again only when watchFailFirst has passed (the interval
// doubling up to watchFailMax) with the count of tries since, at DEBUG
// in between, and once at INFO when a watch is established again.
type watchFailLog struct {
	failures int           // tries failed since the last success
	said     int           // failures when last said at WARN
	next     time.Time     // when a failure is said at WARN again
	every    time.Duration // the interval after next
}

const (
	watchFailFirst = 30 * time.Second
	watchFailMax   = 10 * time.Minute
)

// fail logs one failed try of msg.
func (l *watchFailLog) fail(log *slog.Logger, msg string, args ...any) {
	now := time.Now()
	l.failures++
	switch {
	case l.failures == 1:
		l.every = watchFailFirst
		log.Warn(msg, append(args, "repeats", "said again at most every "+watchFailFirst.String()+" (doubling) while it lasts")...)
	case !now.Before(l.next):
		log.Warn(msg, append(args, "failures", l.failures, "since_last_said", l.failures-l.said)...)
		l.every = min(2*l.every, watchFailMax)
	default:
		log.Debug(msg, append(args, "failures", l.failures)...)
		return
	}
	l.said, l.next = l.failures, now.Add(l.every)
}

// ok notes a watch established: a failure said before is said to be over.
func (l *watchFailLog) ok(log *slog.Logger) {
	if l.failures > 0 {
		log.Info("watch established again", "failed_tries", l.failures)
	}
	*l = watchFailLog{}
}
